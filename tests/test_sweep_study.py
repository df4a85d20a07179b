import json
import os
import subprocess
import sys

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


def test_a_killed_workers_trial_is_retried_and_counted_once(tmp_path, monkeypatch, fake_trainer):
    from test_sweep_runner import _sweep_loss

    url, workdir = f"sqlite:///{tmp_path / 's.db'}", str(tmp_path / "sweep")
    s = study.open_study(_spec(workdir), study.open_storage(url), "s")
    dead = study._take(s)  # a worker took it and died: its heartbeat is old
    dead.suggest_categorical("setting", ["tau_0.1", "tau_0.3", "tau_0.9"])
    dead.set_user_attr("heartbeat", 0.0)
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


def test_bad_storage_and_foreign_studies_get_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"--storage postgresql://nobody@127.0.0.1:1/db: cannot open it"):
        study.open_storage("postgresql://nobody@127.0.0.1:1/db")
    storage = study.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    study.open_study(_spec(str(tmp_path / "a")), storage, "s")
    with pytest.raises(ConfigError, match="study 's' belongs to another sweep spec"):
        study.open_study(_spec(str(tmp_path / "a"), fractions=(0.5,)), storage, "s")
    with pytest.raises(ConfigError, match="study 's' belongs to another sweep spec"):
        study.open_study(_spec(str(tmp_path / "b")), storage, "s")


@pytest.fixture
def postgres_url(tmp_path_factory):
    """A PostgreSQL server of Debian's packages (postgresql), started here on a free port; skipped without it."""
    import glob
    import shutil
    import socket
    import tempfile
    import time

    psycopg = pytest.importorskip("psycopg")
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        pytest.skip("no PostgreSQL server here (Debian: apt-get install postgresql)")
    directory = tempfile.mkdtemp(prefix="celerity-pg-")
    as_server = []
    if os.geteuid() == 0:  # the server refuses to run as root
        shutil.chown(directory, "postgres")
        as_server = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(directory, "data")
    subprocess.run([*as_server, f"{bins[-1]}/initdb", "-D", data, "-A", "trust", "-U", "celerity"], check=True,
                   capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([*as_server, f"{bins[-1]}/postgres", "-D", data, "-p", str(port), "-k", directory,
                               "-c", "listen_addresses=127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"postgresql://celerity@127.0.0.1:{port}/postgres"
    try:
        for _ in range(100):
            try:
                psycopg.connect(url).close()
                break
            except psycopg.OperationalError:
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow  # starts a server: about 10 s
def test_the_sweep_runs_on_a_postgresql_server(tmp_path, postgres_url, one_worker):
    _two_workers_as_one(tmp_path, postgres_url, one_worker)
