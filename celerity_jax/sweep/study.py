"""`celerity sweep --storage URL`: the sweep's settings as the trials of an Optuna study, which any number of
workers take from one storage (the same command on several hosts, or `--workers N` processes on one).

The first worker to open the study creates it, records the sweep's spec in it and enqueues one trial per setting;
a worker whose spec differs (another sweep, or the same study name given to two sweeps) stops with one line. A
worker takes waiting trials one at a time, atomically through the storage, until none is left. A trial trains its
setting's references and its target to each of the spec's fractions, reports the predictor's final loss there
(pruner.report) and is pruned by the CollapsePruner, from --stop-at on, once it cannot
beat the best finished setting; else it trains to the end and its value is the true final loss. With "auto" a
trial predicts by the method its own references choose (the other settings' may not be trained yet); the summary
ranks every setting by one method, as the sequential sweep does.

While a trial runs, its worker records in it its host and PID, and a heartbeat every HEARTBEAT_S seconds. A
running trial whose worker ran on this host and has ended, or whose heartbeat is older than STALE_S (its worker,
on another host, was killed), is failed and enqueued again by the next worker that looks, as is the trial of a
worker stopped by an error or an interrupt; its runs resume from their checkpoints, and the report counts each
setting once, by its last trial. A run that a worker killed on another host left locked stops each worker that
takes its setting, with a line naming the run.lock to delete once that worker is known to be gone (the run lock,
train/lock.py, cannot check a process on another host); then a rerun resumes it. Every worker that finds no
trial waiting or running writes sweep.json and sweep.md, as the sequential sweep does.

The storage must be shared and persistent: an in-memory SQLite database (`sqlite://`, `sqlite:///:memory:`) is
refused, since each process, even each thread, would see its own and a rerun could not resume it.
"""

import json
import os
import threading
import time

import optuna
import sqlalchemy

from celerity_jax.collapse.predictor import Prediction, window_at
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic, write_text_atomic
from celerity_jax.sweep import pruner, report, runner
from celerity_jax.sweep.spec import SweepSpec
from celerity_jax.train import lock

HEARTBEAT_S = 10.0
STALE_S = 60.0
SPEC_ATTR = "celerity_sweep_spec"
SETTING_PARAM = "setting"
TrialState = optuna.trial.TrialState
STORAGES = "sqlite:///PATH, journal:PATH or postgresql://USER@HOST/DB"  # what --storage takes, for error lines


def database_url(url: str) -> str:
    """The SQLAlchemy URL of `--storage URL`, checked: an in-memory SQLite database is refused, and
    `postgresql://` is read by psycopg 3, the `sweep` extra's driver (SQLAlchemy before 2.1 would take psycopg2)."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
        parsed.get_dialect()
    except sqlalchemy.exc.ArgumentError as e:
        raise ConfigError(f"--storage {url!r}: not a storage URL ({e}); give {STORAGES}") from None
    if parsed.get_backend_name() == "sqlite" and (not parsed.database or ":memory:" in parsed.database
                                                  or parsed.query.get("mode") == "memory"):
        raise ConfigError(f"--storage {url}: an in-memory database, which a sweep's workers cannot share and a "
                          "rerun cannot resume; give a file, e.g. sqlite:///sweep.db")
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def open_storage(url: str, tries: int = 3) -> optuna.storages.BaseStorage:
    """SQLite or PostgreSQL (`sqlite:///PATH`, `postgresql://...`), or a journal file (`journal:PATH`). Workers
    that start together race to create the tables of a new database: the losers try again."""
    if url.startswith("journal:"):
        return _open_journal(url)
    database = database_url(url)
    for attempt in range(tries):
        try:
            return optuna.storages.RDBStorage(database)
        except Exception as e:  # noqa: BLE001 -- any driver's error: the storage cannot be used, said in one line
            if attempt == tries - 1 or isinstance(e, ImportError | OSError):
                raise _cannot_open(url, e) from None
            time.sleep(1.0)


def _open_journal(url: str) -> optuna.storages.JournalStorage:
    """The journal file, read once: a file that holds something else is refused before anything is written to it."""
    path = url.removeprefix("journal:")
    try:
        journal = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
        studies = journal.get_all_studies()
    except (OSError, ValueError) as e:
        raise _cannot_open(url, e) from None
    if not studies and os.path.getsize(path):  # Optuna takes a last line that is not a log for a torn write
        raise ConfigError(f"--storage {url}: {path} holds no Optuna journal; give a new file, or this sweep's journal")
    return journal


def _cannot_open(url: str, e: Exception) -> ConfigError:
    return ConfigError(f"--storage {url}: cannot open it ({type(e).__name__}: {str(e).splitlines()[0]}); give "
                       f"{STORAGES}: a file this host can write, or a server it reaches (the `sweep` extra installs "
                       "PostgreSQL's driver)")


def spec_record(spec: SweepSpec) -> str:
    """What makes two workers' sweeps the same one: the spec but for its force flags."""
    fields = {k: v for k, v in vars(spec).items() if k not in ("force_new", "force")}
    return json.dumps(fields, sort_keys=True, default=str)


def open_study(spec: SweepSpec, storage, name: str, timeout_s: float = 60.0) -> optuna.Study:
    """Creates the study with one waiting trial per setting, or loads it and checks that it is this sweep's."""
    pruning = pruner.CollapsePruner(min_frac=spec.stop_at)
    record = spec_record(spec)
    try:
        study = optuna.create_study(storage=storage, study_name=name, pruner=pruning)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, pruner=pruning)
        deadline = time.time() + timeout_s
        while SPEC_ATTR not in study.user_attrs:  # its creator is enqueuing the settings
            if time.time() > deadline:
                raise ConfigError(f"study {name!r} holds no sweep spec after {timeout_s:g} s; it was not made by "
                                  "`celerity sweep`: pass another --study-name") from None
            time.sleep(0.5)
        if study.user_attrs[SPEC_ATTR] != record:
            raise ConfigError(f"study {name!r} belongs to another sweep spec (another sweep, or this one changed); "
                              "pass another --study-name, or the same arguments as its other workers") from None
        return study
    for s in spec.settings:
        study.enqueue_trial({SETTING_PARAM: s.name})
    study.set_user_attr(SPEC_ATTR, record)
    return study


# Study.ask takes "the next" waiting trial, or makes a new one when none waits, which would train a setting twice;
# the storage's public API changes a given trial's state atomically, so that two workers never take, or fail, the
# same one.
def _set_state(study: optuna.Study, storage: optuna.storages.BaseStorage, trial: optuna.trial.FrozenTrial,
               state: TrialState) -> int | None:
    """The trial's id once this worker changed its state; None when another worker changed it first."""
    trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name),
                                                               trial.number)
    try:
        return trial_id if storage.set_trial_state_values(trial_id, state) else None
    except optuna.exceptions.UpdateFinishedTrialError:
        return None


def _retry_stale(study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
    """Fails the running trials whose worker ended here or whose heartbeat stopped, and enqueues their settings
    again."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        silent_s = time.time() - t.user_attrs.get("heartbeat", t.datetime_start.timestamp())
        if (lock.ended_here(t.user_attrs.get("worker", {})) or silent_s > STALE_S) and \
                _set_state(study, storage, t, TrialState.FAIL) is not None:
            study.enqueue_trial(t.params or t.system_attrs.get("fixed_params", {}))


def _take(study: optuna.Study, storage: optuna.storages.BaseStorage) -> optuna.Trial | None:
    """A waiting trial, now running for this worker, which it names (None when none is left)."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial_id = _set_state(study, storage, t, TrialState.RUNNING)
        if trial_id is not None:
            trial = optuna.Trial(study, trial_id)
            trial.set_user_attr("worker", lock.this_process())
            return trial
    return None


def _beating(trial: optuna.Trial, stop: threading.Event, log) -> threading.Thread:
    def beat():
        while not stop.is_set():
            try:
                trial.set_user_attr("heartbeat", time.time())
            except Exception as e:  # noqa: BLE001 -- a storage busy or away for a moment: the next beat tries again
                log(f"trial {trial.number}: heartbeat not recorded ({type(e).__name__}); trying again in "
                    f"{HEARTBEAT_S:g} s")
            stop.wait(HEARTBEAT_S)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    return thread


def _run_trial(trial: optuna.Trial, sr: runner.SettingRuns, spec: SweepSpec, train_fn, log) -> float:
    """Trains one setting to each fraction, reporting its predicted final loss; its true final loss."""
    def train(run, until=None):
        run.train_to(until, force_new=spec.force_new, log=log, train_fn=train_fn)

    for run in sr.references:
        train(run)
    ref_paths = runner.reference_paths(sr, spec.force)
    for frac in spec.fractions:
        step = runner.stop_step(sr.target.plan, frac)
        train(sr.target, step)
        predictions = runner.setting_predictions(sr, ref_paths, spec)
        p = predictions[predictions["method"]][str(frac)]
        if p is not None:
            pruner.report(trial, Prediction(p["pred"], p["err"], frac, window_at(frac, None, spec.align_start)), step)
            if trial.should_prune():
                raise optuna.TrialPruned(f"{sr.setting.name}: pruned at t̂ = {frac:g}")
    train(sr.target)
    return report.true_final(sr.target)


def open_sweep(spec: SweepSpec, storage_url: str, study_name: str) -> tuple[dict, optuna.storages.BaseStorage,
                                                                             optuna.Study]:
    """The sweep's runs by setting (planned and checked), its storage and its study: every check a worker makes
    before it trains."""
    if spec.stop_at is None:
        raise ConfigError("--storage needs --stop-at F: the fraction of training from which the collapse pruner may "
                          "stop a setting, e.g. --stop-at 0.2")
    if spec.shared_references:
        raise ConfigError("--shared-references with --storage: several workers would train the shared references "
                          "at once; drop --shared-references (each setting then trains its own)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    setting_runs = {sr.setting.name: sr for sr in runner.plan_sweep(spec)}
    storage = open_storage(storage_url)
    return setting_runs, storage, open_study(spec, storage, study_name)


def run_worker(spec: SweepSpec, storage_url: str, study_name: str, train_fn=None, log=print) -> dict | None:
    """Takes the study's trials until none is left; writes and returns the summary when no trial is running."""
    setting_runs, storage, study = open_sweep(spec, storage_url, study_name)
    os.makedirs(spec.workdir, exist_ok=True)
    while True:
        _retry_stale(study, storage)
        trial = _take(study, storage)
        if trial is None:
            break
        sr = setting_runs[trial.suggest_categorical(SETTING_PARAM, list(setting_runs))]
        stop = threading.Event()
        _beating(trial, stop, log)
        try:
            value = _run_trial(trial, sr, spec, train_fn, log)
        except optuna.TrialPruned as pruned:
            stop.set()
            study.tell(trial, state=TrialState.PRUNED)
            log(f"\n{pruned}")
            continue
        except BaseException:  # an error or an interrupt: the setting waits for the next worker, which resumes it
            stop.set()
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial({SETTING_PARAM: sr.setting.name})
            raise
        stop.set()
        study.tell(trial, value)
    return write_summary(spec, list(setting_runs.values()), study, log)


def summary(spec: SweepSpec, storage_url: str, study_name: str, log=print) -> dict | None:
    """write_summary of the study (when its trials are done), e.g. after its workers ended."""
    study = open_study(spec, open_storage(storage_url), study_name)
    return write_summary(spec, runner.plan_sweep(spec), study, log)


def write_summary(spec: SweepSpec, setting_runs: list, study: optuna.Study, log=print) -> dict | None:
    """sweep.json and sweep.md from the runs' directories, once no trial is waiting or running (else None); the
    settings whose last trial was pruned are stopped."""
    if study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        log("\nother workers are still running trials; the last of them writes the summary")
        return None
    last = {t.params[SETTING_PARAM]: t.state for t in study.get_trials(deepcopy=False) if t.params}
    ref_paths = {sr.setting.name: runner.reference_paths(sr, spec.force) for sr in setting_runs}
    predicted = runner.sweep_predictions(setting_runs, ref_paths, spec)
    runs = [*{r.name: r for sr in setting_runs for r in sr.references}.values(), *(sr.target for sr in setting_runs)]
    done = {r.name: r.steps_done() for r in runs}
    stopped = [name for name, state in last.items() if state == TrialState.PRUNED]
    summary = report.summarize(spec, setting_runs, predicted, done, {r.name: r.train_seconds() for r in runs},
                               stopped)
    write_json_atomic(os.path.join(spec.workdir, "sweep.json"), summary)
    write_text_atomic(os.path.join(spec.workdir, "sweep.md"), report.render_markdown(summary))
    return summary
