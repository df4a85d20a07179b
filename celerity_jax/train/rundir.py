"""The run directory: the names of its files, what makes it the same run, and starting it over.

A run directory holds:
- run.json: the run's identity (model, recipe, data, monitor, plan; see `run_identity`); a directory
  whose run.json differs holds a different run and is refused (or archived with --force-new);
- plan.json: the recipe's plan (steps, batch, learning rates, ...);
- config.gin: the operative gin config, defaults included;
- curve.csv: one row per step with a finite loss (step, tokens, frac, loss; see writers.CurveCSV);
- eval.csv: one row per eval, the loss on the fixed held-out batches (the same columns);
- TensorBoard events (events.out.tfevents.*);
- checkpoints/: the train state and data position (see checkpoint.py);
- timing.json: the wall-clock seconds spent training it (see celerity_jax.run);
- init_from.json in a run started from another run's checkpoint (see init_from.py);
- run.lock, the writer's lock (see lock.py), and celerity.log, what libraries logged (see logfile.py);
- archived-<time>/: earlier runs moved aside by --force-new.
"""

import dataclasses
import json
import os
import shutil
import time

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_text_atomic

RUN_JSON = "run.json"
PLAN_JSON = "plan.json"
CONFIG_GIN = "config.gin"
CURVE_CSV = "curve.csv"
EVAL_CSV = "eval.csv"
LOSS_CSV = {"train": CURVE_CSV, "eval": EVAL_CSV}  # the loss curves a run records
CHECKPOINTS = "checkpoints"
TIMING_JSON = "timing.json"
INIT_FROM_JSON = "init_from.json"
LOCK_FILE = "run.lock"
LOG_FILE = "celerity.log"
ARCHIVE_PREFIX = "archived-"
KEPT_ON_ARCHIVE = (LOCK_FILE, LOG_FILE)


def run_identity(configs, plan) -> dict:
    """What makes two runs the same run: model, recipe, data and monitor (not logging or checkpoint
    cadence). JSON-normalized, so it compares equal to what run.json holds."""
    return json.loads(json.dumps({
        "model": dataclasses.asdict(configs.model), "recipe": dataclasses.asdict(configs.recipe),
        "data": dataclasses.asdict(configs.data), "monitor": dataclasses.asdict(configs.monitor),
        "plan": plan.to_dict()}))


def _field_defaults() -> dict:
    """Each identity section's config-field defaults, JSON-normalized."""
    from celerity_jax.collapse.config import MonitorConfig  # here, not at the top: collapse imports this module
    from celerity_jax.data.config import DataConfig
    from celerity_jax.model.config import ModelConfig
    from celerity_jax.recipe import RecipeConfig

    classes = {"model": ModelConfig, "recipe": RecipeConfig, "data": DataConfig, "monitor": MonitorConfig}
    return json.loads(json.dumps({section: {f.name: f.default for f in dataclasses.fields(cls)
                                            if f.default is not dataclasses.MISSING}
                                  for section, cls in classes.items()}))


def same_run(previous: dict, identity: dict) -> bool:
    """Whether an identity read back (run.json, a checkpoint's) is `identity`'s run. A config field that the
    older identity lacks (the field was added since) counts as equal when `identity` holds its default."""
    return with_added_defaults(previous, identity) == identity


def with_added_defaults(previous: dict, identity: dict) -> dict:
    """`previous` with each config field it lacks that `identity` holds at the field's default filled in."""
    out = json.loads(json.dumps(previous))
    for section, defaults in _field_defaults().items():
        old, new = out.get(section), identity.get(section)
        if isinstance(old, dict) and isinstance(new, dict):
            old.update({name: default for name, default in defaults.items()
                        if name not in old and name in new and new[name] == default})
    return out


def run_json_path(workdir: str) -> str:
    return os.path.join(workdir, RUN_JSON)


def check_workdir(workdir: str, identity: dict, force_new: bool) -> bool:
    """Whether the workdir holds an earlier run to archive; refuses one that differs (read-only)."""
    path = run_json_path(workdir)
    if not os.path.exists(path):
        return False
    try:
        with open(path) as f:
            previous = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable ({e}); pass --force-new to archive this workdir's contents "
                          "inside it and start over, or use another --workdir") from None
    if force_new:
        return True
    if not same_run(previous, identity):
        raise ConfigError(
            f"workdir {workdir} holds a different run "
            f"({'; '.join(diff(with_added_defaults(previous, identity), identity)[:6])}); use another "
            "--workdir, or pass --force-new to archive the old run inside it and start over")
    return False


def archive_workdir(workdir: str, log=print) -> None:
    """Moves the previous run in the workdir into `archived-<time>/` inside it (nothing is deleted; the lock
    and the log file stay)."""
    archive = os.path.join(workdir, f"{ARCHIVE_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(archive)
    for name in os.listdir(workdir):
        if not name.startswith(ARCHIVE_PREFIX) and name not in KEPT_ON_ARCHIVE:
            shutil.move(os.path.join(workdir, name), os.path.join(archive, name))
    log(f"--force-new: moved the previous run in {workdir} to {archive}")


def write_run_files(workdir: str, identity: dict, plan, operative_config: str) -> None:
    """run.json, plan.json and (when given) config.gin, each replaced whole."""
    write_text_atomic(run_json_path(workdir), json.dumps(identity, indent=2))
    write_text_atomic(os.path.join(workdir, PLAN_JSON), plan.to_json())
    if operative_config:
        write_text_atomic(os.path.join(workdir, CONFIG_GIN), operative_config)


def diff(a, b, prefix="") -> list[str]:
    """`key: old -> new` for every leaf where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} -> {b!r}"]
