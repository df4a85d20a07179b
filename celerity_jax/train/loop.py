"""`train()`: plan, check, build, restore, then run the jitted step with logging and checkpoints.

Run directory layout: config.gin (operative gin config), plan.json, run.json (what identifies the run),
TensorBoard events, curve.csv (step, tokens, frac, loss), checkpoints/, run.lock and celerity.log (see
rundir.py), and init_from.json in a run started from another run's checkpoint (TrainConfig.init_from, see
init_from.py).
"""

import contextlib
import dataclasses
import json
import math
import os
import shutil
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
from celerity_jax.errors import DISK_ERRNOS, ConfigError, RunStopped
from celerity_jax.fileio import check_local_path, write_text_atomic
from celerity_jax.train import init_from, interrupts, rundir
from celerity_jax.train import step as step_lib
from celerity_jax.train.checkpoint import Checkpointer, checkpoint_steps
from celerity_jax.train.config import TrainConfig
from celerity_jax.train.writers import CurveCSV, Progress, TensorBoardWriter


CONSOLE_METRICS = {"loss": "train/loss_smooth", "eval": "eval/loss", "lr": "opt/lr",
                   "residual": "collapse/residual", "tok/s": "perf/tokens_per_sec"}


class TrainingDiverged(RunStopped):
    """The loss stopped being finite more often than TrainConfig.max_bad_steps allows."""
    exit_code = 3


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
          verbose: bool = False, log=print) -> dict:
    """Trains (or resumes) the run in `workdir`; returns a summary dict.

    Process 0 holds the workdir's run lock throughout and sends library output to its log file (see
    rundir.py); Ctrl-C stops at the next safe point (see interrupts.py)."""
    is_chief = jax.process_index() == 0  # only process 0 writes files and prints
    with interrupts.handled():
        check_local_path(workdir, "workdir")
        check_local_path(configs.train.init_from, "TrainConfig.init_from")
        for path in configs.train.collapse_reference:
            check_local_path(path, "TrainConfig.collapse_reference")
        plan = recipe.make_plan(configs.model, configs.recipe)
        data_lib.check_vocab(data_lib.tokenizer_vocab_size(configs.data), configs.model.vocab_size)
        mesh = sharding.make_mesh(configs.train.mesh_shape)
        sharding.check_batch_divisible(plan.batch_seqs, mesh, configs.train.microbatches)
        lock = _lock_workdir(workdir, is_chief, log)
        if not is_chief:
            return _train(configs, plan, mesh, workdir, operative_config, force_new, is_chief, lambda _: None)
        try:
            with rundir.library_output_to_log(workdir, verbose or rundir.verbose_from_env()):
                return _train(configs, plan, mesh, workdir, operative_config, force_new, is_chief, log)
        except OSError as e:
            if e.errno not in DISK_ERRNOS:
                raise
            free = shutil.disk_usage(workdir).free / 1e6
            raise ConfigError(f"writing in {workdir} failed ({e.strerror}{f': {e.filename}' if e.filename else ''}"
                              f"; {free:.1f} MB free); free space or fix permissions, then rerun") from None
        finally:
            lock.release()


def _lock_workdir(workdir: str, is_chief: bool, log) -> rundir.RunLock | None:
    """Process 0 takes the workdir's run lock. With several processes all learn whether it did, so that none
    waits at a barrier for a process 0 that has stopped."""
    lock, error = None, None
    if is_chief:
        try:
            lock = rundir.acquire(workdir, log)
        except ConfigError as e:
            error = e
    if jax.process_count() > 1 and not multihost_utils.broadcast_one_to_all(np.int32(error is None)):
        error = error or ConfigError(f"process 0 could not lock {workdir}; its output says why")
    if error:
        raise error
    return lock


def _train(configs: RunConfigs, plan: recipe.Plan, mesh, workdir: str, operative_config: str, force_new: bool,
           is_chief: bool, log) -> dict:
    model_cfg, train_cfg, monitor_cfg = configs.model, configs.train, configs.monitor
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
    interrupts.raise_if_requested()

    build = step_lib.build_step(model_cfg, plan, monitor_cfg, mesh, microbatches=train_cfg.microbatches,
                                z_loss=train_cfg.z_loss, seed=train_cfg.seed)
    train_step = compile_train_step(build, plan, train_cfg, model_cfg)
    interrupts.raise_if_requested()

    identity = run_identity(configs, plan)
    archive = rundir.check_workdir(workdir, identity, force_new)
    source = None
    if train_cfg.init_from:
        if archive or not checkpoint_steps(os.path.join(workdir, "checkpoints")):
            source = init_from.open_source(train_cfg.init_from)
            init_from.check_compatible(source, identity, model_cfg)
            init_from.set_data_position(data_it, source)
        else:
            log(f"TrainConfig.init_from is set but {workdir} holds checkpoints of its own: resuming from them")
    if archive and is_chief:
        rundir.archive_workdir(workdir, log)
    multihost_utils.sync_global_devices("celerity_workdir")
    if is_chief:
        write_text_atomic(rundir.run_json_path(workdir), json.dumps(identity, indent=2))
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
    interrupts.raise_if_requested()

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), identity, train_cfg.keep_last,
                                train_cfg.keep_every, train_cfg.async_checkpointing)
    tb = None
    try:
        start_step, restored_step = 0, None
        restored = checkpointer.restore_latest(state, log=log)
        if restored is not None:
            start_step, state, data_state = restored
            restored_step = start_step
            data_it.set_state(data_state)
            log(f"resumed from the checkpoint at step {start_step} in {workdir}/checkpoints")
        elif source is not None:
            state, start_step = init_from.restore_state(source, state), source.step
            differences = rundir.diff(source.identity, identity)
            if is_chief:
                init_from.start_run_dir(source, workdir, differences, plan.steps)
            log(init_from.describe(source, differences, plan.steps))
        interrupts.raise_if_requested()
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
        if reference_G is None:
            log("no collapse reference given (TrainConfig.collapse_reference): the monitor records the curve "
                "but collapse/* metrics are off; build one with `celerity collapse reference`")
        summary = {"workdir": workdir, "start_step": start_step, "steps": plan.steps, "stopped": "finished"}
        if source is not None:
            summary["init_from"] = os.path.join(source.checkpoints_dir, str(source.step))
        loop = _Loop(plan, train_cfg, monitor_cfg, train_step, eval_step, eval_batches, reference_G, data_it,
                     batch_sh, checkpointer, tb, curve, is_chief, restored_step)
        summary.update(loop.run(state, start_step))
    except BaseException:
        _close_quietly(tb, checkpointer)
        raise
    if tb:
        tb.close()
    checkpointer.close()
    return summary


def _close_quietly(tb: TensorBoardWriter | None, checkpointer: Checkpointer) -> None:
    """Closes the writers of a run that is already stopping on an error, which they must not mask (on a full
    disk closing fails too)."""
    with contextlib.suppress(Exception):
        if tb:
            tb.close()
    with contextlib.suppress(Exception):
        checkpointer.close(raise_errors=False)


@dataclasses.dataclass
class _Loop:
    """The training loop from `start_step`: steps, logs, evals, checkpoints, and every reason to stop."""
    plan: recipe.Plan
    train_cfg: TrainConfig
    monitor_cfg: object
    train_step: object
    eval_step: object
    eval_batches: list
    reference_G: object
    data_it: object
    batch_sharding: object
    checkpointer: Checkpointer
    tb: TensorBoardWriter | None
    curve: CurveCSV | None
    is_chief: bool
    restored_step: int | None

    def run(self, state, start_step: int) -> dict:
        plan, train_cfg, monitor_cfg = self.plan, self.train_cfg, self.monitor_cfg
        peak = peak_flops_per_device(jax.devices()[0].device_kind, train_cfg.peak_flops_per_sec) * jax.device_count()
        progress = Progress(plan.steps, start_step, quiet=not self.is_chief)
        last_step = min(plan.steps, train_cfg.stop_at_step or plan.steps)
        bad_at_start = int(jax.device_get(state.bad_steps))
        pending, loss_ema, stopped = [], _LossEMA(train_cfg.loss_ema), "finished"
        t_log, step_at_log = time.time(), start_step
        step = start_step
        try:
            while step < last_step:
                batch = next(self.data_it)
                batch = {k: jax.make_array_from_process_local_data(self.batch_sharding, v) for k, v in batch.items()}
                state, metrics = self.train_step(state, batch)
                step += 1
                pending.append(metrics["train/loss"])
                self.checkpointer.check_for_errors()
                interrupted = interrupts.requested()
                is_log = step % train_cfg.log_every == 0 or step == last_step or interrupted
                is_eval = train_cfg.eval_every and (step % train_cfg.eval_every == 0 or step == plan.steps)
                is_ckpt = step % train_cfg.checkpoint_every == 0 or step == last_step or interrupted
                if not (is_log or is_eval or is_ckpt):
                    continue
                losses = np.asarray(jax.device_get(pending), np.float64)
                bad, first_bad = (int(x) for x in jax.device_get((state.bad_steps, state.first_bad_step)))
                if bad > train_cfg.max_bad_steps:
                    raise TrainingDiverged(self._diverged(bad, first_bad, bad - bad_at_start, step - start_step))
                values = {k: float(v) for k, v in jax.device_get(metrics).items()}
                values["train/loss_smooth"] = loss_ema.update(losses)
                values["progress/frac"] = step / plan.steps
                values.update(_perf_metrics(plan, (time.time() - t_log) / (step - step_at_log), peak))
                if self.reference_G is not None:
                    collapse = jax.device_get(monitor_lib.monitor_metrics(state.monitor, self.reference_G,
                                                                          monitor_cfg))
                    values.update({k: float(v) for k, v in collapse.items()})
                if is_eval:
                    values["eval/loss"] = float(np.mean([float(self.eval_step(state.params, b))
                                                         for b in self.eval_batches]))
                if self.is_chief:
                    write_log_step(self.tb, self.curve, plan, step, losses, values)
                shown = {name: values[k] for name, k in CONSOLE_METRICS.items()
                         if math.isfinite(values.get(k, math.nan))}
                progress.update(step, shown)
                if values.get("collapse/alert", 0.0) > 0:
                    progress.message(f"COLLAPSE ALERT at step {step} (frac {step / plan.steps:.3f}): residual "
                                     f"{values['collapse/residual']:+.4f} left {monitor_cfg.alert_k}·sigma for "
                                     f"{monitor_cfg.alert_m} bins")
                    if monitor_cfg.stop_on_alert:
                        stopped = "collapse_alert"
                        is_ckpt = True
                pending, t_log, step_at_log = [], time.time(), step
                if is_ckpt:
                    self.checkpointer.save(step, state, self.data_it.get_state())
                if interrupted:
                    self.checkpointer.wait_until_saved()
                    raise interrupts.Interrupted(f"interrupted: saved a checkpoint at step {step}; rerun the same "
                                                 "command to resume")
                if stopped == "collapse_alert":
                    break
            if step == last_step and step < plan.steps:
                stopped = "stop_at_step"
        finally:
            progress.close()
        return {"stopped": stopped, "final_step": step, "skipped_steps": int(jax.device_get(state.bad_steps))}

    def _diverged(self, bad: int, first_bad: int, bad_since_start: int, steps_since_start: int) -> str:
        where = f"the loss was not finite at step {first_bad} ({bad} bad steps, TrainConfig.max_bad_steps=" \
                f"{self.train_cfg.max_bad_steps}); stopped without saving"
        if self.restored_step is not None and bad_since_start == steps_since_start:
            return (f"{where}. Every step since resuming from the checkpoint at step {self.restored_step} was "
                    "non-finite, so that checkpoint may be corrupt (it passed its checksums only if it has any): "
                    f"move {self.checkpointer.directory}/{self.restored_step} out of the folder to resume from an "
                    "older one")
        good = self.checkpointer.latest_step()
        kept = f"the last good checkpoint (step {good}) is untouched" if good is not None else \
            "no checkpoint had been saved"
        return f"{where}; {kept}. Lower the LR, or raise max_bad_steps to skip such steps"
