"""Starting a new run directory from another run's checkpoint (`TrainConfig.init_from`).

This is how a run is restarted into a new directory, with its settings changed or not: the new run gets
the source's params, optimizer moments, step, collapse-monitor curve and data-iterator position, and
trains on under its own config from there.

- The source is a run directory (its newest checkpoint) or one checkpoint, `<run>/checkpoints/<step>`.
  It is only read, never written or moved.
- The parameter shapes, the total steps T (so that the LR schedule and t̂ = step/T stay on time) and
  the monitor's grid must equal the source's; the data position carries over only onto the same data
  layout. Everything else may differ, and every difference from the source's run.json is logged.
- Constant optimizer hyperparameters (the weight decay λ) are this run's: restored as they are, the
  optimizer state would silently keep the λ it was saved with. The LR follows this run's schedule at
  the restored step count.
- curve.csv starts with the source's rows up to the step, so offline tools see the curve the monitor
  holds; `init_from.json` records the source, the step and the differences.
- It applies only while the workdir has no checkpoint of its own; after that the run resumes its own.
"""

import csv
import dataclasses
import io
import json
import os
import time

import jax

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic, write_text_atomic
from celerity_jax.model import transformer
from celerity_jax.model.config import ModelConfig
from celerity_jax import rundir
from celerity_jax.rundir import checkpoint
from celerity_jax.rundir.identity import Identity


@dataclasses.dataclass(frozen=True)
class Source:
    path: str               # as given in TrainConfig.init_from
    run_dir: str
    checkpoints_dir: str
    step: int
    identity: dict          # the source's run.json
    data_state: dict        # its data-iterator position at `step`


def open_source(path: str) -> Source:
    """Finds the checkpoint that `path` names and reads the source's run.json and data position."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, rundir.CHECKPOINTS)):
        run_dir, checkpoints_dir = path, os.path.join(path, rundir.CHECKPOINTS)
        steps = checkpoint.checkpoint_steps(checkpoints_dir)
        if not steps:
            raise ConfigError(f"TrainConfig.init_from = {path!r}: {checkpoints_dir} holds no checkpoint; "
                              "point it at a run that saved one")
        step = steps[-1]
    elif os.path.basename(path).isdigit() and os.path.isdir(path):
        checkpoints_dir = os.path.dirname(path)
        run_dir, step = os.path.dirname(checkpoints_dir), int(os.path.basename(path))
    else:
        raise ConfigError(f"TrainConfig.init_from = {path!r} is neither a run directory with checkpoints/ nor "
                          "a checkpoint directory <run>/checkpoints/<step>; give one of those")
    run_json = rundir.run_json_path(run_dir)
    try:
        with open(run_json) as f:
            identity = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"TrainConfig.init_from: cannot read the source's {run_json} ({e}); init_from needs "
                          "a run directory written by `celerity train`") from e
    _, data_state = checkpoint.read_checkpoint(checkpoints_dir, step)
    return Source(path, run_dir, checkpoints_dir, step, identity, data_state)


def _param_shapes(model: ModelConfig):
    return jax.eval_shape(lambda: transformer.init_params(model, jax.random.key(0)))


def check_compatible(source: Source, identity: Identity, model: ModelConfig) -> None:
    """Refuses a source whose parameter shapes, total steps or monitor grid differ from this run's."""
    where = f"TrainConfig.init_from = {source.path!r}"
    steps, source_steps = identity.record["plan"]["steps"], source.identity["plan"]["steps"]
    if steps != source_steps:
        raise ConfigError(f"{where}: the source's plan has {source_steps} steps and this run's {steps}; the LR "
                          "schedule and t̂ = step/T would jump at the restart. Keep the token budget and batch "
                          "(RecipeConfig.tpp, batch_seqs, seq_len) of the source")
    source_monitor, monitor = identity.completed(source.identity)["monitor"], identity.record["monitor"]
    for name in ("n_bins", "loss_curve"):  # the monitor's binned curve carries over
        if monitor[name] != source_monitor.get(name):
            raise ConfigError(f"{where}: MonitorConfig.{name} is {monitor[name]!r} here and "
                              f"{source_monitor.get(name)!r} in the source, whose binned curve carries over; use "
                              f"the source's {name}")
    try:
        source_model = ModelConfig(**source.identity["model"])
    except (TypeError, ConfigError) as e:
        raise ConfigError(f"{where}: the model in {source.run_dir}/run.json is not readable ({e})") from e
    if (jax.tree.map(lambda x: x.shape, _param_shapes(source_model))
            != jax.tree.map(lambda x: x.shape, _param_shapes(model))):
        raise ConfigError(f"{where}: the source's parameters have other shapes than this run's model; keep the "
                          "source's ModelConfig shape (d_model, n_layers, heads, vocab, mlp, ...)")


def set_data_position(data_it, source: Source) -> None:
    """Moves this run's data iterator to the source's position (before anything is written)."""
    try:
        data_it.set_state(source.data_state)
    except ConfigError as e:
        raise ConfigError(f"TrainConfig.init_from = {source.path!r}: the source's data position does not carry "
                          f"over ({e}). init_from needs the source's data layout: DataConfig, seq_len, batch and "
                          "TrainConfig.seed") from e


def restore_state(source: Source, like_state):
    """The source's train state, with this run's constant optimizer hyperparameters (λ)."""
    state, _ = checkpoint.read_checkpoint(source.checkpoints_dir, source.step, like_state)
    restored, plan = state.opt_state, like_state.opt_state  # build_optimizer's inject_hyperparams state
    hyperparams = {k: v if k in restored.hyperparams_states else plan.hyperparams[k]
                   for k, v in restored.hyperparams.items()}
    return dataclasses.replace(state, opt_state=restored._replace(hyperparams=hyperparams))


def start_run_dir(source: Source, workdir: str, differences: list[str], total_steps: int) -> None:
    """Writes init_from.json and, unless the workdir has them, curve.csv and eval.csv with the source's rows
    up to the step."""
    write_json_atomic(os.path.join(workdir, rundir.INIT_FROM_JSON), {
        "source": source.run_dir, "checkpoint": os.path.join(source.checkpoints_dir, str(source.step)),
        "step": source.step, "frac": source.step / total_steps, "differences": differences,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    for name in (rundir.CURVE_CSV, rundir.EVAL_CSV):
        src, dst = os.path.join(source.run_dir, name), os.path.join(workdir, name)
        if os.path.exists(dst) or not os.path.exists(src):
            continue
        with open(src, newline="") as f:
            rows = list(csv.reader(f))
        text = io.StringIO()
        csv.writer(text).writerows([rows[0]] + [r for r in rows[1:] if r and int(r[0]) <= source.step])
        write_text_atomic(dst, text.getvalue())


def describe(source: Source, differences: list[str], total_steps: int) -> str:
    """The loud log message of a start from another run."""
    lines = [f"INIT_FROM: this run starts at step {source.step} of {total_steps} (t̂ {source.step / total_steps:.3f}) "
             f"from {os.path.join(source.checkpoints_dir, str(source.step))}: params, optimizer moments, monitor "
             "curve and data position carry over"]
    if differences:
        lines.append(f"INIT_FROM: this run's config differs from the source's in {len(differences)} place(s):")
        lines += [f"    {d}" for d in differences]
    else:
        lines.append("INIT_FROM: this run's config equals the source's")
    if not os.path.exists(os.path.join(source.run_dir, rundir.CURVE_CSV)):
        lines.append(f"INIT_FROM: the source has no curve.csv; this run's curve.csv starts at step {source.step + 1}")
    return "\n".join(lines)
