"""`train()`: check, lock, prepare (setup.py), then step with logs, evals and checkpoints until a reason to stop.

What the run directory holds is listed in celerity_jax/rundir/__init__.py.
"""

import contextlib
import enum
import shutil
from typing import NamedTuple

import jax

from celerity_jax.configs import RunDefinition
from celerity_jax.errors import DISK_ERRNOS, ConfigError, RunStopped
from celerity_jax.train import interrupts, logfile, setup
from celerity_jax.train.downstream import downstream_steps
from celerity_jax.train.log_step import StepLog
from celerity_jax.train.progress import Progress


class StopReason(enum.StrEnum):
    """Why a run that was not interrupted stopped (the summary's "stopped")."""
    FINISHED = "finished"              # at the plan's last step
    STOP_AT_STEP = "stop_at_step"      # at TrainConfig.stop_at_step, before the plan's end
    COLLAPSE_ALERT = "collapse_alert"  # the monitor alerted and MonitorConfig.stop_on_alert is set


class TrainingDiverged(RunStopped):
    """The loss stopped being finite more often than TrainConfig.max_bad_steps allows."""
    exit_code = 3


def train(run: RunDefinition, workdir: str, *, force_new: bool = False, verbose: bool = False, log=print) -> dict:
    """Trains (or resumes) `run` in `workdir`; returns a summary dict.

    Process 0 holds the workdir's run lock throughout and sends library output to its log file (see lock.py,
    logfile.py); Ctrl-C stops at the next safe point (see interrupts.py). `force_new` archives an earlier run
    found in the workdir, whatever it is."""
    is_chief = jax.process_index() == 0  # only process 0 writes files and prints
    where = setup.Workdir(workdir, is_chief, log if is_chief else lambda _: None)
    with interrupts.handled():
        mesh, downstream_tasks = setup.check_run(run, workdir)
        with setup.locked_workdir(where), _library_output(workdir, is_chief, verbose):
            with setup.prepare(run, mesh, where, force_new=force_new, downstream_tasks=downstream_tasks) as trainer:
                end = run_loop(trainer)
    start = trainer.start
    return {"workdir": workdir, "start_step": start.step, "steps": run.plan.steps, "stopped": end.stopped,
            **({"init_from": start.init_from} if start.init_from else {}),
            "final_step": end.final_step, "skipped_steps": end.skipped_steps}


@contextlib.contextmanager
def _library_output(workdir: str, is_chief: bool, verbose: bool):
    """On process 0: library output into the workdir's log file, and a failed write on a full or read-only disk
    explained in one line."""
    if not is_chief:
        yield
        return
    try:
        with logfile.library_output_to_log(workdir, verbose or logfile.verbose_from_env()):
            yield
    except OSError as e:
        if e.errno not in DISK_ERRNOS:
            raise
        free = shutil.disk_usage(workdir).free / 1e6
        raise ConfigError(f"writing in {workdir} failed ({e.strerror}{f': {e.filename}' if e.filename else ''}"
                          f"; {free:.1f} MB free); free space or fix permissions, then rerun") from None


class LoopEnd(NamedTuple):
    stopped: StopReason
    final_step: int
    skipped_steps: int  # steps whose loss was not finite (their updates skipped)


def run_loop(t: setup.Trainer) -> LoopEnd:
    """Steps from `t.start.step` until the last step or a collapse alert (with stop_on_alert). Ctrl-C raises
    Interrupted after saving a checkpoint; too many non-finite losses raise TrainingDiverged."""
    plan, train_cfg, monitor_cfg, last_step = t.run.plan, t.run.configs.train, t.run.configs.monitor, t.run.last_step
    progress = Progress(plan.steps, t.start.step, quiet=not t.workdir.is_chief)
    step_log = StepLog(t.run, t.writers, progress, t.start.step, t.measures)
    state, step, pending, stopped = t.start.state, t.start.step, [], StopReason.FINISHED
    eval_steps = train_cfg.all_eval_steps(plan.steps)
    scored_steps = downstream_steps(train_cfg, plan.steps)
    bad_at_start = int(jax.device_get(state.bad_steps))
    try:
        while step < last_step and stopped is StopReason.FINISHED:
            state, metrics = t.train_step(state, t.batches.next())
            step += 1
            pending.append(metrics["train/loss"])
            t.checkpointer.check_for_errors()
            interrupted = interrupts.requested()
            is_log = step % train_cfg.log_every == 0 or step == last_step or interrupted
            is_eval = step in eval_steps
            is_checkpoint = step % train_cfg.checkpoint_every == 0 or step == last_step or interrupted
            is_scored = step in scored_steps
            if not (is_log or is_eval or is_checkpoint or is_scored):
                continue
            _raise_if_diverged(t, state, bad_at_start, step)
            state, eval_loss = step_log.evaluate(step, state) if is_eval else (state, None)
            if is_scored:
                step_log.score_downstream(step, state.params)
            values = step_log.record(step, state, metrics, pending, eval_loss=eval_loss, last=step == last_step)
            pending = []
            if values.get("collapse/alert", 0.0) > 0:
                _report_alert(progress, monitor_cfg, step, plan.steps, values["collapse/residual"])
                if monitor_cfg.stop_on_alert:
                    stopped = StopReason.COLLAPSE_ALERT
            if is_checkpoint or stopped is StopReason.COLLAPSE_ALERT:
                t.checkpointer.save(step, state, t.batches.iterator.get_state())
            if interrupted:
                t.checkpointer.wait_until_saved()
                raise interrupts.Interrupted(f"interrupted: saved a checkpoint at step {step}; rerun the same "
                                             "command to resume")
        if step == last_step and step < plan.steps:
            stopped = StopReason.STOP_AT_STEP
    finally:
        progress.close()
    return LoopEnd(stopped, step, int(jax.device_get(state.bad_steps)))


def _report_alert(progress: Progress, monitor_cfg, step: int, total_steps: int, residual: float) -> None:
    progress.message(f"COLLAPSE ALERT at step {step} (frac {step / total_steps:.3f}): residual {residual:+.4f} left "
                     f"{monitor_cfg.alert_k}·sigma for {monitor_cfg.alert_m} bins")


def bad_step_counts(state) -> tuple[int, int]:
    """How many steps had a non-finite loss so far, and the first of them."""
    bad, first_bad = jax.device_get((state.bad_steps, state.first_bad_step))
    return int(bad), int(first_bad)


def _raise_if_diverged(t: setup.Trainer, state, bad_at_start: int, step: int) -> None:
    """Stops without saving once more losses were non-finite (their updates skipped) than max_bad_steps allows."""
    bad, first_bad = bad_step_counts(state)
    max_bad = t.run.configs.train.max_bad_steps
    if bad <= max_bad:
        return
    where = f"the loss was not finite at step {first_bad} ({bad} bad steps, TrainConfig.max_bad_steps=" \
            f"{max_bad}); stopped without saving"
    restored = t.start.restored_step
    if restored is not None and bad - bad_at_start == step - t.start.step:
        raise TrainingDiverged(
            f"{where}. Every step since resuming from the checkpoint at step {restored} was non-finite, so "
            "that checkpoint may be corrupt (it passed its checksums only if it has any): move "
            f"{t.checkpointer.directory}/{restored} out of the folder to resume from an older one")
    good = t.checkpointer.latest_step()
    kept = f"the last good checkpoint (step {good}) is untouched" if good is not None else \
        "no checkpoint had been saved"
    raise TrainingDiverged(f"{where}; {kept}. Lower the LR, or raise max_bad_steps to skip such steps")
