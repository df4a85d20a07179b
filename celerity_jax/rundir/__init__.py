"""The run directory: the names of its files, refusing one that holds a different run, and starting it over.
Its modules: `identity` (what makes two runs the same run), `checkpoint` (the train state, checked), `writers`
(TensorBoard events, curve.csv) and `imported` (the run directory of an imported model).

A run directory holds:
- run.json: the run's identity (model, recipe, data, monitor, plan; see identity.py); a directory
  whose run.json differs holds a different run and is refused (or archived with --force-new);
- plan.json: the recipe's plan (steps, batch, learning rates, ...);
- config.gin: the operative gin config, defaults included;
- curve.csv: one row per step with a finite loss (step, tokens, frac, loss; see writers.CurveCSV);
- eval.csv: one row per eval, the loss on the fixed held-out batches (the same columns);
- TensorBoard events (events.out.tfevents.*);
- checkpoints/: the train state and data position (see checkpoint.py);
- timing.json: the wall-clock seconds spent training it (see celerity_jax/run.py);
- init_from.json in a run started from another run's checkpoint (see train/init_from.py);
- model.gin in the run directory of an imported model: its ModelConfig and tokenizer bindings (see imported.py);
- run.lock, the writer's lock (see train/lock.py), and celerity.log, what libraries logged (train/logfile.py);
- archived-<time>/: earlier runs moved aside by --force-new.
"""

import json
import os
import shutil
import time

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_text_atomic
from celerity_jax.rundir.identity import Identity

RUN_JSON = "run.json"
PLAN_JSON = "plan.json"
CONFIG_GIN = "config.gin"
CURVE_CSV = "curve.csv"
EVAL_CSV = "eval.csv"
LOSS_CSV = {"train": CURVE_CSV, "eval": EVAL_CSV}  # the loss curves a run records
CHECKPOINTS = "checkpoints"
TIMING_JSON = "timing.json"
INIT_FROM_JSON = "init_from.json"
MODEL_GIN = "model.gin"
LOCK_FILE = "run.lock"
LOG_FILE = "celerity.log"
ARCHIVE_PREFIX = "archived-"
KEPT_ON_ARCHIVE = (LOCK_FILE, LOG_FILE)


def run_json_path(workdir: str) -> str:
    return os.path.join(workdir, RUN_JSON)


def check_workdir(workdir: str, identity: Identity, force_new: bool) -> bool:
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
    if not identity.same_run(previous):
        raise ConfigError(
            f"workdir {workdir} holds a different run ({'; '.join(identity.differences(previous)[:6])}); use another "
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


def write_run_files(workdir: str, identity: Identity, plan, operative_config: str) -> None:
    """run.json, plan.json and (when given) config.gin, each replaced whole."""
    write_text_atomic(run_json_path(workdir), json.dumps(identity.record, indent=2))
    write_text_atomic(os.path.join(workdir, PLAN_JSON), plan.to_json())
    if operative_config:
        write_text_atomic(os.path.join(workdir, CONFIG_GIN), operative_config)

