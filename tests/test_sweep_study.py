import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

optuna = pytest.importorskip("optuna")

from celerity_jax.errors import ConfigError  # noqa: E402
from celerity_jax.sweep import spec, study  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
TINY = os.path.join(ROOT, "experiments", "tiny")
SMOKE = os.path.join(TESTS, "configs", "smoke.gin")
TAUS = ("0.1", "0.3", "0.9")

# A worker process: the sweep of _spec() with the FakeTrainer of conftest.py and the synthetic family of
# test_sweep_runner.py (best τ 0.3), over the given storage.
WORKER = """
import sys
sys.path.insert(0, {tests!r})
from conftest import FakeTrainer
from test_sweep_runner import _sweep_loss
from test_sweep_study import _spec
from celerity_jax.sweep import study
study.run_worker(_spec({workdir!r}), {url!r}, "s", train_fn=FakeTrainer(_sweep_loss), log=lambda _: None)
"""


def _spec(workdir: str, **overrides) -> spec.SweepSpec:
    param, settings = spec.parse_sweep("RecipeConfig.tau=" + ",".join(TAUS))
    fields = dict(workdir=workdir, model=os.path.join(TINY, "d80.gin"), param=param, settings=settings,
                  gin_files=(SMOKE,), gin_params=("RecipeConfig.tpp = 4",),
                  reference_models=(os.path.join(TINY, "d48.gin"), os.path.join(TINY, "d64.gin")),
                  fractions=(0.2, 0.3), stop_at=0.2)
    fields.update(overrides)
    return spec.SweepSpec(**fields)


def _workers(n: int, workdir: str, url: str) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER.format(tests=TESTS, workdir=workdir, url=url)], env=env,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]


def _result(workdir: str) -> dict:
    with open(os.path.join(workdir, "sweep.json")) as f:
        summary = json.load(f)
    return {s["name"]: (s["status"], s["final_loss"], s["predictions"]) for s in summary["settings"]}


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """The sweep taken by one worker, in this process, over SQLite: the result two workers must give."""
    from conftest import FakeTrainer
    from test_sweep_runner import _sweep_loss

    workdir = str(tmp_path_factory.mktemp("one") / "sweep")
    study.run_worker(_spec(workdir), f"sqlite:///{workdir}.db", "s", train_fn=FakeTrainer(_sweep_loss),
                     log=lambda _: None)
    return _result(workdir)


# SQLite's two-process run is slow (each worker process starts JAX); the journal's runs in `make test`
@pytest.mark.parametrize("storage", ["journal", pytest.param("sqlite", marks=pytest.mark.slow)])
def test_two_workers_finish_the_sweep_once_each_trial_as_one_worker_does(tmp_path, storage, one_worker):
    url = f"sqlite:///{tmp_path / 's.db'}" if storage == "sqlite" else f"journal:{tmp_path / 's.log'}"
    _two_workers_as_one(tmp_path, url, one_worker)


def _two_workers_as_one(tmp_path, url: str, one_worker: dict) -> None:
    """Two worker processes over `url` take each setting once and agree with one worker on the best and on the
    predictions (which settings are pruned depends on which trial finishes first)."""
    _workers(2, str(tmp_path / "sweep"), url)
    trials = optuna.load_study(study_name="s", storage=study.open_storage(url)).trials
    assert sorted(t.params["setting"] for t in trials) == sorted(f"tau_{t}" for t in TAUS)  # each once
    two = _result(str(tmp_path / "sweep"))
    assert one_worker["tau_0.3"][:2] == two["tau_0.3"][:2] and two["tau_0.3"][0] == "finished"
    for name in one_worker:  # the same predictions wherever the settings trained as far
        assert one_worker[name][2]["family"]["0.2"] == two[name][2]["family"]["0.2"]


def test_a_killed_workers_trial_is_retried_and_counted_once(tmp_path, fake_trainer):
    _taken_by_a_dead_worker(tmp_path, {"heartbeat": 0.0})  # on another host: its heartbeat is old
    _the_dead_workers_trial_is_retried(tmp_path, fake_trainer)


def test_the_trial_of_a_worker_ended_on_this_host_is_retried_at_once(tmp_path, fake_trainer):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    worker = {"host": socket.gethostname(), "pid": int(dead.stdout), "process_start": None}
    _taken_by_a_dead_worker(tmp_path, {"heartbeat": time.time(), "worker": worker})  # beat just before it died
    _the_dead_workers_trial_is_retried(tmp_path, fake_trainer)


def _taken_by_a_dead_worker(tmp_path, attrs: dict) -> None:
    storage = study.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    dead = study._take(study.open_study(_spec(str(tmp_path / "sweep")), storage, "s"), storage)
    dead.suggest_categorical("setting", ["tau_0.1", "tau_0.3", "tau_0.9"])
    for key, value in attrs.items():
        dead.set_user_attr(key, value)


def _the_dead_workers_trial_is_retried(tmp_path, fake_trainer) -> None:
    from test_sweep_runner import _sweep_loss

    url, workdir = f"sqlite:///{tmp_path / 's.db'}", str(tmp_path / "sweep")
    summary = study.run_worker(_spec(workdir), url, "s", train_fn=fake_trainer(_sweep_loss), log=lambda _: None)
    states = [t.state.name for t in optuna.load_study(study_name="s", storage=url).trials]
    assert states.count("FAIL") == 1 and len(states) == 4
    assert sorted(x["name"] for x in summary["settings"]) == sorted(f"tau_{t}" for t in TAUS)


def test_a_worker_stopped_by_an_error_leaves_its_setting_to_the_next(tmp_path, fake_trainer):
    from test_sweep_runner import _sweep_loss

    url, workdir = f"sqlite:///{tmp_path / 's.db'}", str(tmp_path / "sweep")
    trainer = fake_trainer(_sweep_loss)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        study.run_worker(_spec(workdir), url, "s", train_fn=interrupted, log=lambda _: None)
    summary = study.run_worker(_spec(workdir), url, "s", train_fn=trainer, log=lambda _: None)
    states = [t.state.name for t in optuna.load_study(study_name="s", storage=url).trials]
    assert states.count("FAIL") == 1 and len(states) == 4 and summary is not None


def test_a_heartbeat_the_storage_refuses_is_tried_again(monkeypatch):
    class BusyStorageTrial:  # its first heartbeat meets a busy database
        number = 0

        def __init__(self):
            self.beats = []

        def set_user_attr(self, key, value):
            self.beats.append(value)
            if len(self.beats) == 1:
                raise RuntimeError("database is locked")

    monkeypatch.setattr(study, "HEARTBEAT_S", 0.01)
    trial, notes, stop = BusyStorageTrial(), [], threading.Event()
    beating = study._beating(trial, stop, notes.append)
    deadline = time.time() + 10
    while len(trial.beats) < 2 and time.time() < deadline:
        time.sleep(0.01)
    stop.set()
    beating.join()
    assert len(trial.beats) >= 2
    assert notes[0] == "trial 0: heartbeat not recorded (RuntimeError); trying again in 0.01 s"


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite://",
                                 "sqlite:///file:sweep?mode=memory&uri=true"])
def test_an_in_memory_storage_is_refused(url):
    with pytest.raises(ConfigError, match=r"an in-memory database, which a sweep's workers cannot share and a "
                                          r"rerun cannot resume; give a file, e.g. sqlite:///sweep.db"):
        study.open_storage(url)


def test_bad_storage_and_foreign_studies_get_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"--storage postgresql://nobody@127.0.0.1:1/db: cannot open it"):
        study.open_storage("postgresql://nobody@127.0.0.1:1/db")
    for url in ("sweep.db", "postgres://nobody@127.0.0.1:1/db"):  # no scheme; a scheme SQLAlchemy does not know
        with pytest.raises(ConfigError, match=f"--storage '{url}': not a storage URL"):
            study.open_storage(url)
    for text in ("not a journal\n", "not a journal\nat all\n"):  # Optuna reads a bad last line as a torn write
        (tmp_path / "text.log").write_text(text)
        with pytest.raises(ConfigError, match=f"--storage journal:{tmp_path}/text.log: "):
            study.open_storage(f"journal:{tmp_path / 'text.log'}")
        assert (tmp_path / "text.log").read_text() == text
    storage = study.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    study.open_study(_spec(str(tmp_path / "a")), storage, "s")
    with pytest.raises(ConfigError, match="study 's' belongs to another sweep spec"):
        study.open_study(_spec(str(tmp_path / "a"), fractions=(0.5,)), storage, "s")
    with pytest.raises(ConfigError, match="study 's' belongs to another sweep spec"):
        study.open_study(_spec(str(tmp_path / "b")), storage, "s")


@pytest.fixture(scope="module")
def postgres_url():
    """A PostgreSQL server (Debian's postgresql package: initdb and postgres on the PATH or in
    /usr/lib/postgresql/*/bin), started here on a free port; skipped where it is not installed. Its driver,
    psycopg, comes with the `sweep` extra."""
    import glob
    import shutil
    import tempfile

    import psycopg

    server = shutil.which("postgres") or max(glob.glob("/usr/lib/postgresql/*/bin/postgres"), default=None)
    if server is None:
        pytest.skip("no PostgreSQL server here (Debian: apt-get install postgresql)")
    directory = tempfile.mkdtemp(prefix="celerity-pg-")  # not under tmp_path, which only root may enter
    as_server = []
    if os.geteuid() == 0:  # the server refuses to run as root: as the package's `postgres` user
        shutil.chown(directory, "postgres")
        as_server = ["runuser", "-u", "postgres", "--"]
    data, bin_dir = os.path.join(directory, "data"), os.path.dirname(os.path.realpath(server))
    subprocess.run([*as_server, os.path.join(bin_dir, "initdb"), "--no-sync", "-D", data, "-A", "trust", "-U",
                    "celerity"], check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([*as_server, server, "-D", data, "-p", str(port), "-k", directory, "-c", "fsync=off",
                                "-c", "listen_addresses=127.0.0.1"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"postgresql://celerity@127.0.0.1:{port}/postgres"
    try:
        deadline = time.time() + 30
        while True:
            try:
                psycopg.connect(url).close()
                break
            except psycopg.OperationalError:
                assert process.poll() is None and time.time() < deadline, "the PostgreSQL server did not start"
                time.sleep(0.1)
        yield url
    finally:  # at once: a plain SIGTERM waits for the pooled connections to close
        subprocess.run([*as_server, os.path.join(bin_dir, "pg_ctl"), "-D", data, "-m", "immediate", "stop"],
                       capture_output=True)
        process.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


def test_one_worker_on_a_postgresql_server_sweeps_as_on_sqlite(tmp_path, postgres_url, one_worker, fake_trainer):
    from test_sweep_runner import _sweep_loss

    workdir = str(tmp_path / "sweep")
    study.run_worker(_spec(workdir), postgres_url, "one", train_fn=fake_trainer(_sweep_loss), log=lambda _: None)
    assert _result(workdir) == one_worker


@pytest.mark.slow  # two worker processes, each starting JAX
def test_two_workers_on_a_postgresql_server(tmp_path, postgres_url, one_worker):
    _two_workers_as_one(tmp_path, postgres_url, one_worker)
