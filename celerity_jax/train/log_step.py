"""A log step: the metrics of the steps since the previous one, into curve.csv, TensorBoard and the console.

The loop records one every TrainConfig.log_every steps, at evals, at checkpoints and at its last step;
benchmarks/train_throughput.py times the same `StepLog.record`, so that it measures what the trainer does.
With a collapse reference, some log steps also draw the collapse figure (FIGURE_TAG; collapse/image.py).
"""

import dataclasses
import math
import time
from collections.abc import Callable

import jax
import numpy as np

from celerity_jax.accelerators import peak_flops_per_device
from celerity_jax.collapse import curves, image, monitor as monitor_lib
from celerity_jax.configs import RunDefinition
from celerity_jax.rundir.writers import CurveCSV, TensorBoardWriter
from celerity_jax.train import step as step_lib
from celerity_jax.train.progress import Progress

# Console name -> metric, shown when the run logs it and it is finite (moe/dropped: a mixture of experts only).
CONSOLE_METRICS = {"loss": "train/loss_smooth", "eval": "eval/loss", "lr": "opt/lr",
                   "residual": "collapse/residual", "dropped": "moe/dropped", "tok/s": "perf/tokens_per_sec"}

# The collapse figure is drawn at the first log step at or past each 1/FIGURE_POINTS of t̂, and at the last step.
FIGURE_TAG = "collapse/figure"
FIGURE_POINTS = 20


def peak_flops(peak_flops_per_sec: float) -> float:
    """The machine's peak FLOP/s for perf/mfu: TrainConfig.peak_flops_per_sec (0: looked up) times the devices."""
    return peak_flops_per_device(jax.devices()[0].device_kind, peak_flops_per_sec) * jax.device_count()


def perf_metrics(plan, step_time: float, peak: float) -> dict[str, float]:
    """Throughput over a log interval (the train step is compiled before the first; the eval step at its first use)."""
    flops_per_step = plan.flops_per_token * plan.batch_tokens
    out = {"perf/step_time": step_time, "perf/tokens_per_sec": plan.batch_tokens / step_time,
           "perf/model_flops_per_sec": flops_per_step / step_time}
    if peak:
        out["perf/mfu"] = flops_per_step / step_time / peak
    return out


@dataclasses.dataclass(frozen=True)
class Writers:
    """Where process 0 records the run: TensorBoard, curve.csv and, when the run evaluates, eval.csv."""
    tb: TensorBoardWriter
    curve: CurveCSV
    eval_curve: CurveCSV | None = None

    def log_step(self, plan, step: int, losses: np.ndarray, values: dict[str, float]) -> None:
        """Writes the steps since the last log (losses[-1] is `step`'s) to curve.csv and TensorBoard, and the
        log step's metrics."""
        first = step - len(losses) + 1
        self.curve.append([(first + i, (first + i) * plan.batch_tokens, (first + i) / plan.steps, loss)
                           for i, loss in enumerate(losses)])
        for i, loss in enumerate(losses[:-1]):
            self.tb.scalars(first + i, {"train/loss": loss})
        self.tb.scalars(step, values)
        self.tb.flush()


@dataclasses.dataclass(frozen=True)
class Measures:
    """What log steps measure besides the training metrics, each off when absent: collapse/* against a reference
    on the monitor's grid, the eval loss on fixed held-out batches, and downstream scores."""
    reference_G: jax.Array | None = None
    eval_step: Callable | None = None   # (params, batch) -> mean loss
    eval_batches: tuple = ()            # on the devices
    downstream: Callable | None = None  # (step, params) -> the scores' TensorBoard scalars, written


class StepLog:
    """Records the log steps of `run` after `start_step`. Without writers (a process other than 0) it computes the
    same metrics (evals and collapse metrics run on every process) and writes nothing; the collapse figure is drawn
    on process 0 only."""

    def __init__(self, run: RunDefinition, writers: Writers | None, progress: Progress, start_step: int,
                 measures: Measures = Measures()):
        self.plan, self.monitor_cfg, self.loss_ema_decay = run.plan, run.configs.monitor, run.configs.train.loss_ema
        self.writers, self.progress, self.measures = writers, progress, measures
        self.peak = peak_flops(run.configs.train.peak_flops_per_sec)
        self._loss_ema_carry = (0.0, 0.0)  # of train/loss_smooth
        self._time, self._step = time.time(), start_step  # of the previous log step
        self._next_figure = FIGURE_POINTS * start_step // self.plan.steps + 1  # in 1/FIGURE_POINTS of t̂

    def evaluate(self, step: int, state) -> tuple:
        """(state, eval loss at `step`): the mean loss over the fixed held-out batches. With MonitorConfig.loss_curve
        'eval' the returned state's monitor holds it too. Its time is left out of the next perf/* metrics."""
        start = time.time()
        loss = float(np.mean([float(self.measures.eval_step(state.params, b)) for b in self.measures.eval_batches]))
        if self.monitor_cfg.loss_curve == "eval":
            state = step_lib.monitor_eval_loss(state, loss, step / self.plan.steps)
        self._time += time.time() - start
        return state, loss

    def score_downstream(self, step: int, params) -> None:
        """Scores the downstream tasks at `step` (train/downstream.py), into TensorBoard at once; its time is left
        out of the next perf/* metrics."""
        start = time.time()
        values = self.measures.downstream(step, params)
        seconds = time.time() - start
        self._time += seconds
        if self.writers is not None:
            self.writers.tb.scalars(step, values)
        self.progress.message(f"downstream at step {step} ({seconds:.0f} s): " + ", ".join(
            f"{tag.removeprefix('downstream/')} {value:.4f}" for tag, value in values.items()))

    def record(self, step: int, state, metrics: dict, pending: list, eval_loss: float | None = None,
               last: bool = False) -> dict[str, float]:
        """Logs `step`, whose metrics are `metrics`; `pending` holds the losses of the steps since the previous
        log step (the last one is `step`'s). With `eval_loss` (from `evaluate`), that too; `last`: the run's
        last step. Returns the logged values."""
        losses = np.asarray(jax.device_get(pending), np.float64)
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        ema_T, self._loss_ema_carry = curves.loss_ema(losses, self.loss_ema_decay, self._loss_ema_carry)
        values["train/loss_smooth"] = float(ema_T[-1])
        values["progress/frac"] = step / self.plan.steps
        values.update(perf_metrics(self.plan, (time.time() - self._time) / (step - self._step), self.peak))
        reference_G = self.measures.reference_G
        if reference_G is not None:
            collapse = jax.device_get(monitor_lib.monitor_metrics(state.monitor, reference_G, self.monitor_cfg))
            values.update({k: float(v) for k, v in collapse.items()})
        if eval_loss is not None:
            values["eval/loss"] = eval_loss
            if self.writers is not None and self.writers.eval_curve is not None:
                self.writers.eval_curve.append([(step, step * self.plan.batch_tokens, step / self.plan.steps,
                                                 values["eval/loss"])])
        if reference_G is not None and (last or FIGURE_POINTS * step >= self._next_figure * self.plan.steps):
            figure = self._collapse_figure(step, state, values)
            if self.writers is not None:
                self.writers.tb.image(step, FIGURE_TAG, figure)
        if self.writers is not None:
            self.writers.log_step(self.plan, step, losses, values)
        self.progress.update(step, {name: values[k] for name, k in CONSOLE_METRICS.items()
                                    if math.isfinite(values.get(k, math.nan))})
        self._time, self._step = time.time(), step
        return values

    def _collapse_figure(self, step: int, state, values: dict[str, float]) -> bytes | None:
        """The collapse figure's PNG (None on a process other than 0, which computes only the jitted curve)."""
        self._next_figure = FIGURE_POINTS * step // self.plan.steps + 1
        reference_G = self.measures.reference_G
        normalized_G = jax.device_get(monitor_lib.monitor_curve(state.monitor, reference_G, self.monitor_cfg))
        if self.writers is None:
            return None
        return image.collapse_figure(curves.bin_centers(self.monitor_cfg.n_bins), normalized_G,
                                     jax.device_get(reference_G), step / self.plan.steps,
                                     values["collapse/pred_final_loss"], values["collapse/pred_final_loss_err"])
