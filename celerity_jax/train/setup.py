"""Everything before a run's first step, in order: checks, run lock, reference, data, the compiled step, the
run directory's files, the initial or restored state and the writers; the loop gets it as one `Trainer`.

Whatever can be refused is refused before anything is written (paths, vocabulary, mesh, batch, data size, a
train step that does not fit, a workdir holding a different run, an incompatible init_from source). Ctrl-C
is honoured between the phases (interrupts.raise_if_requested).
"""

import contextlib
import dataclasses
import os
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from celerity_jax import rundir
from celerity_jax.collapse import curves, predictor
from celerity_jax.collapse import reference as reference_lib
from celerity_jax.collapse.controls import Controls
from celerity_jax.configs import RunDefinition
from celerity_jax.data import pipeline as data_lib
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_local_path
from celerity_jax.model import sharding
from celerity_jax.model.params import count_active_params
from celerity_jax.rundir.checkpoint import Checkpointer, checkpoint_steps
from celerity_jax.rundir.writers import CurveCSV, TensorBoardWriter
from celerity_jax.train import downstream, init_from, interrupts, lock
from celerity_jax.train import step as step_lib
from celerity_jax.train.log_step import Measures, Writers
from celerity_jax.train.memory import compile_train_step


@dataclasses.dataclass(frozen=True)
class Workdir:
    """The run directory as this process sees it: only process 0 (the chief) writes its files and logs."""
    path: str
    is_chief: bool
    log: Callable[[str], None]  # the chief's; a process other than 0 logs nothing


@dataclasses.dataclass(frozen=True)
class Batches:
    """This process's share of the training batches, laid out on the devices as the train step takes them."""
    iterator: data_lib.TrainIterator
    sharding: jax.sharding.Sharding

    def next(self) -> dict[str, jax.Array]:
        batch = next(self.iterator)
        return {k: jax.make_array_from_process_local_data(self.sharding, v) for k, v in batch.items()}


@dataclasses.dataclass(frozen=True)
class Start:
    """Where the loop starts: the state at `step` (the first step donates it) and where it came from."""
    state: step_lib.TrainState
    step: int
    restored_step: int | None = None  # the run's own checkpoint resumed from
    init_from: str = ""               # the other run's checkpoint this run started from


@dataclasses.dataclass(frozen=True)
class Trainer:
    """A run ready for its first step: what the loop steps, evaluates, logs and checkpoints with."""
    run: RunDefinition
    workdir: Workdir
    train_step: Callable            # compiled: (state, batch) -> (state, metrics); donates the state
    batches: Batches
    checkpointer: Checkpointer
    writers: Writers | None         # process 0's only
    measures: Measures
    start: Start


def check_run(run: RunDefinition, workdir: str) -> tuple[jax.sharding.Mesh, downstream.Downstream | None]:
    """The checks that need nothing read or compiled; returns the device mesh and the run's downstream tasks (None
    without any)."""
    configs = run.configs
    check_local_path(workdir, "workdir")
    check_local_path(configs.train.init_from, "TrainConfig.init_from")
    for path in configs.train.collapse_reference:
        check_local_path(path, "TrainConfig.collapse_reference")
    data_lib.check_vocab(data_lib.tokenizer_vocab_size(configs.data), configs.model.vocab_size,
                         data_lib.tokenizer_label(configs.data))
    mesh = sharding.make_mesh(configs.train.mesh_shape)
    sharding.check_batch_divisible(run.plan.batch_seqs, mesh, configs.train.microbatches)
    return mesh, downstream.Downstream.checked(configs.train)


@contextlib.contextmanager
def locked_workdir(workdir: Workdir):
    """Process 0 holds the workdir's run lock for the block. With several processes all learn whether it got
    it, so that none waits at a barrier for a process 0 that has stopped."""
    held, error = None, None
    if workdir.is_chief:
        try:
            held = lock.acquire(workdir.path, workdir.log)
        except ConfigError as e:
            error = e
    if jax.process_count() > 1 and not multihost_utils.broadcast_one_to_all(np.int32(error is None)):
        error = error or ConfigError(f"process 0 could not lock {workdir.path}; its output says why")
    if error:
        raise error
    try:
        yield
    finally:
        if held:
            held.release()


def _collapse_reference(run: RunDefinition, workdir: Workdir) -> tuple[jax.Array | None, list[str]]:
    """The monitor's reference curve (None without references) and the lines saying how it was made: its method,
    chosen once here at the end of the monitor's align_window (predictor.method_for), what could not be checked,
    and the references outside the short-run regime. The lines are logged here; the writers show them as text."""
    train_cfg, monitor_cfg = run.configs.train, run.configs.monitor
    if not train_cfg.collapse_reference:
        return None, []
    controls = Controls.from_plan(run.plan)
    refs, notes = reference_lib.load_checked(train_cfg.collapse_reference, monitor_cfg, controls, workdir.path,
                                             force=train_cfg.force_reference)
    frac_G = curves.bin_centers(monitor_cfg.n_bins)
    choice = predictor.method_for("auto", refs, frac_G, controls.n_params, monitor_cfg.align_window[1],
                                  monitor_cfg.align_window, offset=monitor_cfg.offset)
    lines = [f"collapse reference: {choice.reason}", *notes,
             *(f"warning: {w}" for w in reference_lib.regime_notes(refs))]
    for line in lines:
        workdir.log(line)
    return predictor.reference_for(refs, frac_G, controls.n_params, choice.method), lines


def _data(run: RunDefinition) -> tuple[data_lib.TrainIterator, list[np.ndarray]]:
    """This process's share of the training batches and of the eval batches."""
    configs, plan = run.configs, run.plan
    local_batch = plan.batch_seqs // jax.process_count()
    where = {"process_index": jax.process_index(), "process_count": jax.process_count()}
    data_it = data_lib.make_train_iterator(configs.data, plan.seq_len, local_batch, seed=configs.train.seed, **where)
    if not configs.data.allow_repeat and plan.steps > data_it.batches_per_epoch:
        raise ConfigError(
            f"the plan needs {plan.steps} batches but the training split holds {data_it.batches_per_epoch:.0f} "
            "and DataConfig.allow_repeat is False; add data, lower RecipeConfig.tpp, or allow repeats")
    eval_batches = data_lib.make_eval_batches(configs.data, plan.seq_len, local_batch, configs.train.eval_batches,
                                              **where)
    return data_it, eval_batches


def _prepare_workdir(run: RunDefinition, workdir: Workdir, data_it, force_new: bool) -> init_from.Source | None:
    """Checks the workdir (and an init_from source), archives an earlier run with `force_new`, writes the run
    files; returns the init_from source when this run starts from it."""
    archive = rundir.check_workdir(workdir.path, run.identity, force_new)
    source = None
    if run.configs.train.init_from:
        if archive or not checkpoint_steps(os.path.join(workdir.path, rundir.CHECKPOINTS)):
            source = init_from.open_source(run.configs.train.init_from)
            init_from.check_compatible(source, run.identity, run.configs.model)
            init_from.set_data_position(data_it, source)
        else:
            workdir.log(f"TrainConfig.init_from is set but {workdir.path} holds checkpoints of its own: resuming "
                        "from them")
    if archive and workdir.is_chief:
        rundir.archive_workdir(workdir.path, workdir.log)
    multihost_utils.sync_global_devices("celerity_workdir")
    if workdir.is_chief:
        rundir.write_run_files(workdir.path, run.identity, run.plan, run.operative_gin)
    return source


def _log_plan_and_data(run: RunDefinition, log) -> None:
    plan, model_cfg = run.plan, run.configs.model
    active = f" ({count_active_params(model_cfg):,} active per token)" if model_cfg.n_experts > 1 else ""
    log(f"plan: N={plan.n_params:,} params{active}, D={plan.tokens:,} tokens ({plan.tpp:g} TPP), {plan.steps} "
        f"steps of {plan.batch_seqs}x{plan.seq_len} tokens, tau={plan.tau:.4g}, weight decay={plan.weight_decay:.4g}, "
        f"hidden peak lr={plan.lr_hidden:.4g}")
    stats = data_lib.corpus_stats(run.configs.data)
    log("data: " + ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in stats.items() if v != []))


def _indented(text: str) -> str:
    """Text that TensorBoard shows as written (markdown code block)."""
    return "    " + text.replace("\n", "\n    ")


def _restore(run: RunDefinition, workdir: Workdir, checkpointer: Checkpointer, data_it,
             source: init_from.Source | None, state) -> tuple[Start, str]:
    """The run's newest good checkpoint, else the init_from source's, else the initial `state`; returns the start
    and, for a start from the init_from source, its description ("" otherwise)."""
    restored = checkpointer.restore_latest(state, log=workdir.log)
    if restored is not None:
        step, state, data_state = restored
        data_it.set_state(data_state)
        workdir.log(f"resumed from the checkpoint at step {step} in {workdir.path}/{rundir.CHECKPOINTS}")
        return Start(state, step, restored_step=step), ""
    if source is None:
        return Start(state, 0), ""
    state = init_from.restore_state(source, state)
    differences = run.identity.differences(source.identity)
    if workdir.is_chief:
        init_from.start_run_dir(source, workdir.path, differences, run.plan.steps)
    description = init_from.describe(source, differences, run.plan.steps)
    workdir.log(description)
    return Start(state, source.step, init_from=os.path.join(source.checkpoints_dir, str(source.step))), description


def _writers(run: RunDefinition, workdir: Workdir, start: Start, init_description: str,
             reference_lines: list[str]) -> Writers | None:
    """Process 0's writers, from the start step on (None elsewhere); a new start records the configs in TensorBoard,
    and every start how the collapse reference was made (`reference_lines`)."""
    if not workdir.is_chief:
        return None
    evaluates = run.configs.train.eval_every or run.configs.train.eval_points
    curve = lambda name: CurveCSV(os.path.join(workdir.path, name), start.step)  # noqa: E731
    writers = Writers(TensorBoardWriter(workdir.path), curve(rundir.CURVE_CSV),
                      curve(rundir.EVAL_CSV) if evaluates else None)
    if run.operative_gin and (start.step == 0 or init_description):
        writers.tb.text(start.step, "config/operative_gin", _indented(run.operative_gin))
        writers.tb.text(start.step, "config/plan", _indented(run.plan.to_json()))
    if init_description:
        writers.tb.text(start.step, "config/init_from", _indented(init_description))
    if reference_lines:
        writers.tb.text(start.step, "collapse/reference", _indented("\n".join(reference_lines)))
    return writers


@contextlib.contextmanager
def prepare(run: RunDefinition, mesh, workdir: Workdir, *, force_new: bool,
            downstream_tasks: downstream.Downstream | None = None):
    """Prepares the run (the caller holds the lock) and yields its `Trainer`; closes the checkpointer, the
    writers and the data iterator after the block, quietly when it raised (the error must not be masked by a
    failed close)."""
    train_cfg = run.configs.train
    reference_G, reference_lines = _collapse_reference(run, workdir)
    data_it, eval_batches_np = _data(run)
    interrupts.raise_if_requested()

    build = step_lib.build_step(run.configs.model, run.plan, run.configs.monitor, mesh,
                                microbatches=train_cfg.microbatches, z_loss=train_cfg.z_loss, seed=train_cfg.seed)
    train_step = compile_train_step(build, run.plan, train_cfg, run.configs.model)
    interrupts.raise_if_requested()

    score_downstream = downstream.make_downstream(downstream_tasks, run, mesh, workdir.path, workdir.is_chief)
    source = _prepare_workdir(run, workdir, data_it, force_new)
    _log_plan_and_data(run, workdir.log)
    workdir.log(f"setting: {step_lib.setting_line(build.setting(run.plan))}")
    state = build.init()
    interrupts.raise_if_requested()

    checkpointer = Checkpointer(os.path.join(workdir.path, rundir.CHECKPOINTS), run.identity, train_cfg.keep_last,
                                train_cfg.keep_every, train_cfg.async_checkpointing)
    writers = None
    try:
        start, init_description = _restore(run, workdir, checkpointer, data_it, source, state)
        interrupts.raise_if_requested()
        eval_batches = tuple(jax.make_array_from_process_local_data(build.batch_sharding, b) for b in eval_batches_np)
        eval_step = step_lib.make_eval_step(run.configs.model, build.batch_sharding, build.state_shardings.params)
        writers = _writers(run, workdir, start, init_description, reference_lines)
        if reference_G is None:
            workdir.log("no collapse reference given (TrainConfig.collapse_reference): the monitor records the curve "
                        "but collapse/* metrics are off; build one with `celerity collapse reference`")
        yield Trainer(run, workdir, train_step, Batches(data_it, build.batch_sharding), checkpointer, writers,
                      Measures(reference_G, eval_step, eval_batches, score_downstream), start)
    except BaseException:
        with contextlib.suppress(Exception):
            if writers:
                writers.tb.close()
        with contextlib.suppress(Exception):
            checkpointer.close(raise_errors=False)
        with contextlib.suppress(Exception):
            data_it.close()  # stops its read workers, if any
        raise
    if writers:
        writers.tb.close()
    checkpointer.close()
    data_it.close()
