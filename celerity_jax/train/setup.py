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

from celerity_jax import recipe, rundir
from celerity_jax.collapse import reference as reference_lib
from celerity_jax.collapse.config import MonitorConfig
from celerity_jax.collapse.controls import Controls
from celerity_jax.data import pipeline as data_lib
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_local_path
from celerity_jax.model import sharding
from celerity_jax.rundir.checkpoint import Checkpointer, checkpoint_steps
from celerity_jax.rundir.identity import Identity
from celerity_jax.rundir.writers import CurveCSV, TensorBoardWriter
from celerity_jax.train import downstream, init_from, interrupts, lock
from celerity_jax.train import step as step_lib
from celerity_jax.train.config import RunConfigs, TrainConfig
from celerity_jax.train.memory import compile_train_step


@dataclasses.dataclass(frozen=True)
class Trainer:
    """A run ready for its first step: what the loop steps, evaluates, logs and checkpoints with."""
    workdir: str
    plan: recipe.Plan
    train_cfg: TrainConfig
    monitor_cfg: MonitorConfig
    train_step: Callable           # compiled: (state, batch) -> (state, metrics); donates the state
    eval_step: Callable            # (params, batch) -> loss
    eval_batches: list             # on the devices
    reference_G: jax.Array | None  # the collapse reference on the monitor's grid; None: collapse/* off
    data_it: data_lib.TrainIterator
    batch_sharding: jax.sharding.Sharding
    checkpointer: Checkpointer
    tb: TensorBoardWriter | None   # the writers exist on process 0 only
    curve: CurveCSV | None
    eval_curve: CurveCSV | None
    is_chief: bool                 # process 0: writes files and prints
    state: step_lib.TrainState     # at start_step (the first step donates it)
    start_step: int
    restored_step: int | None      # the checkpoint resumed from
    init_from: str | None          # the other run's checkpoint this run started from
    downstream: Callable | None    # (step, params) -> downstream scores' scalars (written); None: no tasks

    def next_batch(self) -> dict[str, jax.Array]:
        batch = next(self.data_it)
        return {k: jax.make_array_from_process_local_data(self.batch_sharding, v) for k, v in batch.items()}


def check_run(configs: RunConfigs,
              workdir: str) -> tuple[recipe.Plan, jax.sharding.Mesh, downstream.Downstream | None]:
    """The checks that need nothing read or compiled; returns the plan, the device mesh and the run's downstream
    tasks (None without any)."""
    check_local_path(workdir, "workdir")
    check_local_path(configs.train.init_from, "TrainConfig.init_from")
    for path in configs.train.collapse_reference:
        check_local_path(path, "TrainConfig.collapse_reference")
    plan = recipe.make_plan(configs.model, configs.recipe)
    data_lib.check_vocab(data_lib.tokenizer_vocab_size(configs.data), configs.model.vocab_size,
                         data_lib.tokenizer_label(configs.data))
    mesh = sharding.make_mesh(configs.train.mesh_shape)
    sharding.check_batch_divisible(plan.batch_seqs, mesh, configs.train.microbatches)
    return plan, mesh, downstream.Downstream.checked(configs.train)


@contextlib.contextmanager
def locked_workdir(workdir: str, is_chief: bool, log):
    """Process 0 holds the workdir's run lock for the block. With several processes all learn whether it got
    it, so that none waits at a barrier for a process 0 that has stopped."""
    held, error = None, None
    if is_chief:
        try:
            held = lock.acquire(workdir, log)
        except ConfigError as e:
            error = e
    if jax.process_count() > 1 and not multihost_utils.broadcast_one_to_all(np.int32(error is None)):
        error = error or ConfigError(f"process 0 could not lock {workdir}; its output says why")
    if error:
        raise error
    try:
        yield
    finally:
        if held:
            held.release()


def _collapse_reference(configs: RunConfigs, plan: recipe.Plan, workdir: str, log) -> jax.Array | None:
    train_cfg = configs.train
    if not train_cfg.collapse_reference:
        return None
    reference_G, notes = reference_lib.reference_on_grid(train_cfg.collapse_reference, configs.monitor,
                                                         Controls.from_plan(plan), workdir,
                                                         force=train_cfg.force_reference)
    for note in notes:
        log(note)
    return reference_G


def _data(configs: RunConfigs, plan: recipe.Plan) -> tuple[data_lib.TrainIterator, list[np.ndarray]]:
    """This process's share of the training batches and of the eval batches."""
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


def _prepare_workdir(configs: RunConfigs, plan: recipe.Plan, workdir: str, identity: Identity, data_it,
                     operative_config: str, force_new: bool, is_chief: bool, log) -> init_from.Source | None:
    """Checks the workdir (and an init_from source), archives an earlier run with `force_new`, writes the run
    files; returns the init_from source when this run starts from it."""
    archive = rundir.check_workdir(workdir, identity, force_new)
    source = None
    if configs.train.init_from:
        if archive or not checkpoint_steps(os.path.join(workdir, rundir.CHECKPOINTS)):
            source = init_from.open_source(configs.train.init_from)
            init_from.check_compatible(source, identity, configs.model)
            init_from.set_data_position(data_it, source)
        else:
            log(f"TrainConfig.init_from is set but {workdir} holds checkpoints of its own: resuming from them")
    if archive and is_chief:
        rundir.archive_workdir(workdir, log)
    multihost_utils.sync_global_devices("celerity_workdir")
    if is_chief:
        rundir.write_run_files(workdir, identity, plan, operative_config)
    return source


def _log_plan_and_data(configs: RunConfigs, plan: recipe.Plan, log) -> None:
    log(f"plan: N={plan.n_params:,} params, D={plan.tokens:,} tokens ({plan.tpp:g} TPP), {plan.steps} steps of "
        f"{plan.batch_seqs}x{plan.seq_len} tokens, tau={plan.tau:.4g}, weight decay={plan.weight_decay:.4g}, "
        f"hidden peak lr={plan.lr_hidden:.4g}")
    stats = data_lib.corpus_stats(configs.data)
    log("data: " + ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in stats.items() if v != []))


def _indented(text: str) -> str:
    """Text that TensorBoard shows as written (markdown code block)."""
    return "    " + text.replace("\n", "\n    ")


def _restore(checkpointer: Checkpointer, state, data_it, source: init_from.Source | None, identity: Identity,
             plan: recipe.Plan, workdir: str, is_chief: bool, log) -> tuple[object, int, int | None, str | None]:
    """The run's newest good checkpoint, else the init_from source's, else the initial state. Returns (state,
    start step, the step resumed from or None, the description of an init_from start or None)."""
    restored = checkpointer.restore_latest(state, log=log)
    if restored is not None:
        start_step, state, data_state = restored
        data_it.set_state(data_state)
        log(f"resumed from the checkpoint at step {start_step} in {workdir}/{rundir.CHECKPOINTS}")
        return state, start_step, start_step, None
    if source is None:
        return state, 0, None, None
    state = init_from.restore_state(source, state)
    differences = identity.differences(source.identity)
    if is_chief:
        init_from.start_run_dir(source, workdir, differences, plan.steps)
    description = init_from.describe(source, differences, plan.steps)
    log(description)
    return state, source.step, None, description


@contextlib.contextmanager
def prepare(configs: RunConfigs, plan: recipe.Plan, mesh, workdir: str, *, operative_config: str, force_new: bool,
            is_chief: bool, log, downstream_tasks: downstream.Downstream | None = None):
    """Prepares the run (the caller holds the lock) and yields its `Trainer`; closes the checkpointer, the
    writers and the data iterator after the block, quietly when it raised (the error must not be masked by a
    failed close)."""
    train_cfg = configs.train
    reference_G = _collapse_reference(configs, plan, workdir, log)
    data_it, eval_batches_np = _data(configs, plan)
    interrupts.raise_if_requested()

    build = step_lib.build_step(configs.model, plan, configs.monitor, mesh, microbatches=train_cfg.microbatches,
                                z_loss=train_cfg.z_loss, seed=train_cfg.seed)
    train_step = compile_train_step(build, plan, train_cfg, configs.model)
    interrupts.raise_if_requested()

    score_downstream = downstream.make_downstream(downstream_tasks, configs, plan, mesh, workdir, is_chief)
    identity = Identity.of(configs, plan)
    source = _prepare_workdir(configs, plan, workdir, identity, data_it, operative_config, force_new, is_chief, log)
    _log_plan_and_data(configs, plan, log)
    log(f"setting: {step_lib.setting_line(build.setting(plan))}")
    state = build.init()
    interrupts.raise_if_requested()

    checkpointer = Checkpointer(os.path.join(workdir, rundir.CHECKPOINTS), identity, train_cfg.keep_last,
                                train_cfg.keep_every, train_cfg.async_checkpointing)
    tb = None
    try:
        state, start_step, restored_step, init_description = _restore(checkpointer, state, data_it, source,
                                                                      identity, plan, workdir, is_chief, log)
        interrupts.raise_if_requested()
        batch_sh = build.batch_sharding
        eval_batches = [jax.make_array_from_process_local_data(batch_sh, b) for b in eval_batches_np]
        eval_step = step_lib.make_eval_step(configs.model, batch_sh, build.state_shardings.params)

        tb = TensorBoardWriter(workdir) if is_chief else None
        curve = CurveCSV(os.path.join(workdir, rundir.CURVE_CSV), start_step) if is_chief else None
        evaluates = train_cfg.eval_every or train_cfg.eval_points
        eval_curve = CurveCSV(os.path.join(workdir, rundir.EVAL_CSV), start_step) if is_chief and evaluates else None
        if tb and operative_config and (start_step == 0 or init_description):
            tb.text(start_step, "config/operative_gin", _indented(operative_config))
            tb.text(start_step, "config/plan", _indented(plan.to_json()))
        if tb and init_description:
            tb.text(start_step, "config/init_from", _indented(init_description))
        if reference_G is None:
            log("no collapse reference given (TrainConfig.collapse_reference): the monitor records the curve "
                "but collapse/* metrics are off; build one with `celerity collapse reference`")
        yield Trainer(
            workdir=workdir, plan=plan, train_cfg=train_cfg, monitor_cfg=configs.monitor, train_step=train_step,
            eval_step=eval_step, eval_batches=eval_batches, reference_G=reference_G, data_it=data_it,
            batch_sharding=batch_sh, checkpointer=checkpointer, tb=tb, curve=curve, eval_curve=eval_curve,
            is_chief=is_chief, state=state, start_step=start_step, restored_step=restored_step,
            init_from=os.path.join(source.checkpoints_dir, str(source.step)) if init_description else None,
            downstream=score_downstream)
    except BaseException:
        with contextlib.suppress(Exception):
            if tb:
                tb.close()
        with contextlib.suppress(Exception):
            checkpointer.close(raise_errors=False)
        with contextlib.suppress(Exception):
            data_it.close()  # stops its read workers, if any
        raise
    if tb:
        tb.close()
    checkpointer.close()
    data_it.close()
