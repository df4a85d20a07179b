"""`train()`: plan, check, build, restore, then run the jitted step with logging and checkpoints.

Run directory layout: config.gin (operative gin config), plan.json, run.json (what identifies the run),
TensorBoard events, curve.csv (step, tokens, frac, loss), checkpoints/, and init_from.json in a run started
from another run's checkpoint (TrainConfig.init_from, see init_from.py).
"""

import dataclasses
import json
import math
import os
import shutil
import signal
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from celerity_jax import recipe, sharding
from celerity_jax.accelerators import peak_flops_per_device
from celerity_jax.aot.memory import compile_train_step
from celerity_jax.collapse import monitor as monitor_lib
from celerity_jax.collapse.loading import Controls
from celerity_jax.data import pipeline as data_lib
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_local_path, write_text_atomic
from celerity_jax.train import init_from
from celerity_jax.train import step as step_lib
from celerity_jax.train.checkpoint import Checkpointer, checkpoint_steps
from celerity_jax.train.config import TrainConfig
from celerity_jax.train.writers import CurveCSV, Progress, TensorBoardWriter


CONSOLE_METRICS = {"loss": "train/loss_smooth", "eval": "eval/loss", "lr": "opt/lr",
                   "residual": "collapse/residual", "tok/s": "perf/tokens_per_sec"}


class TrainingDiverged(RuntimeError):
    """The loss stopped being finite more often than TrainConfig.max_bad_steps allows."""


@dataclasses.dataclass(frozen=True)
class RunConfigs:
    model: object
    recipe: object
    data: object
    train: TrainConfig
    monitor: object


def run_identity(configs: RunConfigs, plan) -> dict:
    """What makes two runs the same run: model, recipe, data and monitor (not logging or checkpoint
    cadence). JSON-normalized, so it compares equal to what run.json holds."""
    return json.loads(json.dumps({
        "model": dataclasses.asdict(configs.model), "recipe": dataclasses.asdict(configs.recipe),
        "data": dataclasses.asdict(configs.data), "monitor": dataclasses.asdict(configs.monitor),
        "plan": plan.to_dict()}))


def check_workdir(workdir: str, identity: dict, force_new: bool) -> bool:
    """Whether the workdir holds an earlier run to archive; refuses one that differs (read-only)."""
    path = os.path.join(workdir, "run.json")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        previous = json.load(f)
    if force_new:
        return True
    if previous != identity:
        raise ConfigError(
            f"workdir {workdir} holds a different run ({'; '.join(_diff(previous, identity)[:6])}); use another "
            "--workdir, or pass --force_new to archive the old run inside it and start over")
    return False


def archive_workdir(workdir: str, log=print) -> None:
    """Moves everything in the workdir into `archived-<time>/` inside it (nothing is deleted)."""
    archive = os.path.join(workdir, f"archived-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(archive)
    for name in os.listdir(workdir):
        if not name.startswith("archived-"):
            shutil.move(os.path.join(workdir, name), os.path.join(archive, name))
    log(f"--force_new: moved the previous run in {workdir} to {archive}")


def _diff(a, b, prefix="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} -> {b!r}"]


class _LossEMA:
    """Bias-corrected exponential moving average of the finite training losses."""

    def __init__(self, decay: float):
        self.decay, self.value, self.weight = decay, 0.0, 0.0

    def update(self, losses) -> float:
        for loss in losses:
            if math.isfinite(loss):
                self.weight = self.decay * self.weight + (1 - self.decay)
                self.value = self.decay * self.value + (1 - self.decay) * loss
        return self.value / self.weight if self.weight else math.nan


def _perf_metrics(plan, step_time: float, peak_flops: float) -> dict[str, float]:
    """Throughput over a log interval (the train step is compiled before the first; the eval step at its first use)."""
    flops_per_step = plan.flops_per_token * plan.batch_tokens
    out = {"perf/step_time": step_time, "perf/tokens_per_sec": plan.batch_tokens / step_time,
           "perf/model_flops_per_sec": flops_per_step / step_time}
    if peak_flops:
        out["perf/mfu"] = flops_per_step / step_time / peak_flops
    return out


def write_log_step(tb: TensorBoardWriter, curve: CurveCSV, plan, step: int, losses: np.ndarray,
                   values: dict[str, float]) -> None:
    """Writes the steps since the last log (losses[-1] is `step`'s) to curve.csv and TensorBoard, and the
    log step's metrics."""
    first = step - len(losses) + 1
    curve.append([(first + i, (first + i) * plan.batch_tokens, (first + i) / plan.steps, loss)
                  for i, loss in enumerate(losses)])
    for i, loss in enumerate(losses[:-1]):
        tb.scalars(first + i, {"train/loss": loss})
    tb.scalars(step, values)
    tb.flush()


def train(configs: RunConfigs, workdir: str, *, operative_config: str = "", force_new: bool = False,
          log=print) -> dict:
    """Trains (or resumes) the run in `workdir`; returns a summary dict."""
    model_cfg, train_cfg, monitor_cfg = configs.model, configs.train, configs.monitor
    check_local_path(workdir, "workdir")
    check_local_path(train_cfg.init_from, "TrainConfig.init_from")
    for path in train_cfg.collapse_reference:
        check_local_path(path, "TrainConfig.collapse_reference")
    is_chief = jax.process_index() == 0  # only process 0 writes files and prints
    if not is_chief:
        log = lambda _: None  # noqa: E731
    plan = recipe.make_plan(model_cfg, configs.recipe)
    data_lib.check_vocab(data_lib.tokenizer_vocab_size(configs.data), model_cfg.vocab_size)
    mesh = sharding.make_mesh(train_cfg.mesh_shape)
    sharding.check_batch_divisible(plan.batch_seqs, mesh, train_cfg.microbatches)
    controls = Controls(n_params=plan.n_params, tpp=plan.tpp, tau=plan.tau, schedule=plan.schedule,
                        warmup_frac=plan.warmup_steps / plan.steps)
    reference_G = None
    if train_cfg.collapse_reference:
        reference_G, notes = monitor_lib.monitor_reference(
            train_cfg.collapse_reference, monitor_cfg, controls, workdir, force=train_cfg.force_reference)
        for note in notes:
            log(note)
    local_batch = plan.batch_seqs // jax.process_count()
    data_it = data_lib.make_train_iterator(configs.data, plan.seq_len, local_batch, seed=train_cfg.seed,
                                           process_index=jax.process_index(), process_count=jax.process_count())
    if not configs.data.allow_repeat and plan.steps > data_it.batches_per_epoch:
        raise ConfigError(
            f"the plan needs {plan.steps} batches but the training split holds {data_it.batches_per_epoch:.0f} "
            "and DataConfig.allow_repeat is False; add data, lower RecipeConfig.tpp, or allow repeats")
    eval_batches_np = data_lib.make_eval_batches(configs.data, plan.seq_len, local_batch, train_cfg.eval_batches,
                                                 process_index=jax.process_index(),
                                                 process_count=jax.process_count())

    build = step_lib.build_step(model_cfg, plan, monitor_cfg, mesh, microbatches=train_cfg.microbatches,
                                z_loss=train_cfg.z_loss, seed=train_cfg.seed)
    train_step = compile_train_step(build, plan, train_cfg, model_cfg)

    identity = run_identity(configs, plan)
    archive = check_workdir(workdir, identity, force_new)
    source = None
    if train_cfg.init_from:
        if archive or not checkpoint_steps(os.path.join(workdir, "checkpoints")):
            source = init_from.open_source(train_cfg.init_from)
            init_from.check_compatible(source, identity, model_cfg)
            init_from.set_data_position(data_it, source)
        else:
            log(f"TrainConfig.init_from is set but {workdir} holds checkpoints of its own: resuming from them")
    if archive and is_chief:
        archive_workdir(workdir, log)
    multihost_utils.sync_global_devices("celerity_workdir")
    if is_chief:
        os.makedirs(workdir, exist_ok=True)
        write_text_atomic(os.path.join(workdir, "run.json"), json.dumps(identity, indent=2))
        write_text_atomic(os.path.join(workdir, "plan.json"), plan.to_json())
        if operative_config:
            write_text_atomic(os.path.join(workdir, "config.gin"), operative_config)

    log(f"plan: N={plan.n_params:,} params, D={plan.tokens:,} tokens ({plan.tpp:g} TPP), {plan.steps} steps of "
        f"{plan.batch_seqs}x{plan.seq_len} tokens, tau={plan.tau:.4g}, weight decay={plan.weight_decay:.4g}, "
        f"hidden peak lr={plan.lr_hidden:.4g}")
    stats = data_lib.corpus_stats(configs.data)
    log("data: " + ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in stats.items() if v != []))
    state_sh, batch_sh = build.state_shardings, build.batch_sharding
    state = build.init()

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), train_cfg.keep_last, train_cfg.keep_every,
                                train_cfg.async_checkpointing)
    start_step = 0
    restored = checkpointer.restore_latest(state, log=log)
    if restored is not None:
        start_step, state, data_state = restored
        data_it.set_state(data_state)
        log(f"resumed from the checkpoint at step {start_step} in {workdir}/checkpoints")
    elif source is not None:
        state, start_step = init_from.restore_state(source, state), source.step
        differences = _diff(source.identity, identity)
        if is_chief:
            init_from.start_run_dir(source, workdir, differences, plan.steps)
        log(init_from.describe(source, differences, plan.steps))
    eval_batches = [jax.make_array_from_process_local_data(batch_sh, b) for b in eval_batches_np]

    eval_step = step_lib.make_eval_step(model_cfg, batch_sh, state_sh.params)

    tb = TensorBoardWriter(workdir) if is_chief else None
    curve = CurveCSV(os.path.join(workdir, "curve.csv"), start_step) if is_chief else None
    if tb and operative_config and (start_step == 0 or source is not None):
        tb.text(start_step, "config/operative_gin", "    " + operative_config.replace("\n", "\n    "))
        tb.text(start_step, "config/plan", "    " + plan.to_json().replace("\n", "\n    "))
    if tb and source is not None:
        tb.text(start_step, "config/init_from", "    " + init_from.describe(source, differences, plan.steps)
                .replace("\n", "\n    "))
    progress = Progress(plan.steps, start_step, quiet=not is_chief)
    peak = peak_flops_per_device(jax.devices()[0].device_kind, train_cfg.peak_flops_per_sec) * jax.device_count()
    if reference_G is None:
        log("no collapse reference given (TrainConfig.collapse_reference): the monitor records the curve "
            "but collapse/* metrics are off; build one with `celerity collapse reference`")

    interrupted = []
    previous_handler = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True)) \
        if threading.current_thread() is threading.main_thread() else None
    last_step = min(plan.steps, train_cfg.stop_at_step or plan.steps)
    pending, loss_ema = [], _LossEMA(train_cfg.loss_ema)
    summary = {"workdir": workdir, "start_step": start_step, "steps": plan.steps, "stopped": "finished"}
    if source is not None:
        summary["init_from"] = os.path.join(source.checkpoints_dir, str(source.step))
    t_log, step_at_log = time.time(), start_step
    step = start_step
    try:
        while step < last_step:
            batch = next(data_it)
            batch = {k: jax.make_array_from_process_local_data(batch_sh, v) for k, v in batch.items()}
            state, metrics = train_step(state, batch)
            step += 1
            pending.append(metrics["train/loss"])
            is_log = step % train_cfg.log_every == 0 or step == last_step or interrupted
            is_eval = train_cfg.eval_every and (step % train_cfg.eval_every == 0 or step == plan.steps)
            is_ckpt = step % train_cfg.checkpoint_every == 0 or step == last_step or interrupted
            if not (is_log or is_eval or is_ckpt):
                continue
            losses = np.asarray(jax.device_get(pending), np.float64)
            bad, first_bad = (int(x) for x in jax.device_get((state.bad_steps, state.first_bad_step)))
            if bad > train_cfg.max_bad_steps:
                raise TrainingDiverged(
                    f"the loss was not finite at step {first_bad} ({bad} bad steps, TrainConfig.max_bad_steps="
                    f"{train_cfg.max_bad_steps}); stopped without saving, the last good checkpoint "
                    f"(step {checkpointer.latest_step()}) is untouched. Lower the LR, or raise max_bad_steps "
                    "to skip such steps")
            values = {k: float(v) for k, v in jax.device_get(metrics).items()}
            values["train/loss_smooth"] = loss_ema.update(losses)
            values["progress/frac"] = step / plan.steps
            values.update(_perf_metrics(plan, (time.time() - t_log) / (step - step_at_log), peak))
            if reference_G is not None:
                collapse = jax.device_get(monitor_lib.monitor_metrics(state.monitor, reference_G, monitor_cfg))
                values.update({k: float(v) for k, v in collapse.items()})
            if is_eval:
                values["eval/loss"] = float(np.mean([float(eval_step(state.params, b)) for b in eval_batches]))
            if is_chief:
                write_log_step(tb, curve, plan, step, losses, values)
            shown = {name: values[k] for name, k in CONSOLE_METRICS.items() if math.isfinite(values.get(k, math.nan))}
            progress.update(step, shown)
            if values.get("collapse/alert", 0.0) > 0:
                progress.message(f"COLLAPSE ALERT at step {step} (frac {step / plan.steps:.3f}): residual "
                                 f"{values['collapse/residual']:+.4f} left {monitor_cfg.alert_k}·sigma for "
                                 f"{monitor_cfg.alert_m} bins")
                if monitor_cfg.stop_on_alert:
                    summary["stopped"] = "collapse_alert"
                    is_ckpt = True
            pending, t_log, step_at_log = [], time.time(), step
            if is_ckpt:
                checkpointer.save(step, state, data_it.get_state())
            if interrupted:
                summary["stopped"] = "interrupted"
                progress.message(f"interrupted: saved a checkpoint at step {step}; rerun the same command to resume")
                break
            if summary["stopped"] == "collapse_alert":
                break
        if step == last_step and step < plan.steps:
            summary["stopped"] = "stop_at_step"
    finally:
        progress.close()
        checkpointer.close()
        if tb:
            tb.close()
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
    summary["final_step"] = step
    return summary
