"""The run lock: one writer per run directory."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from celerity_jax.errors import ConfigError
from celerity_jax import rundir
from celerity_jax.train import lock


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    workdir = str(tmp_path / "run")
    with lock.locked(workdir):
        with open(os.path.join(workdir, rundir.LOCK_FILE)) as f:
            holder = json.load(f)
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(ConfigError, match=f"in use by pid {os.getpid()} on host") as e:
            lock.acquire(workdir)
        assert "\n" not in str(e.value)
    with lock.locked(workdir):  # released: free again
        pass


def test_a_new_workdir_left_empty_is_removed_with_its_lock(tmp_path):
    with lock.locked(str(tmp_path / "run")):
        assert (tmp_path / "run" / rundir.LOCK_FILE).exists()
    assert not (tmp_path / "run").exists()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stale_lock_on_this_host_is_taken_over_with_a_note(tmp_path):
    (tmp_path / rundir.LOCK_FILE).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": _dead_pid(), "started": "yesterday", "command": "celerity train"}))
    notes = []
    with lock.locked(str(tmp_path), log=notes.append):
        assert json.loads((tmp_path / rundir.LOCK_FILE).read_text())["pid"] == os.getpid()
    assert len(notes) == 1 and "no longer running" in notes[0]


def test_a_reused_pid_is_stale(tmp_path):
    (tmp_path / rundir.LOCK_FILE).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": os.getppid(), "process_start": "1", "started": "?"}))
    with lock.locked(str(tmp_path), log=lambda _: None):
        pass


def test_a_lock_of_another_host_is_refused_with_the_file_to_delete(tmp_path):
    (tmp_path / rundir.LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "?"}))
    with pytest.raises(ConfigError, match=f"once it has ended, delete {tmp_path}/run.lock"):
        lock.acquire(str(tmp_path))


@pytest.mark.parametrize("workdir, match", [
    ("f", "is a file, not a folder"),
    ("f/sub", "no folder can be made under it"),
])
def test_workdir_paths_that_cannot_be_folders_are_refused(tmp_path, workdir, match):
    (tmp_path / "f").write_text("a file")
    with pytest.raises(ConfigError, match=match):
        lock.acquire(str(tmp_path / workdir))


def test_two_concurrent_trains_on_one_workdir(tmp_path, curve_losses, celerity_train):
    workdir = tmp_path / "run"
    steps = ("TrainConfig.stop_at_step = 60",)
    first = celerity_train(workdir, *steps)
    deadline = time.time() + 300
    while not (workdir / rundir.LOCK_FILE).exists() or not (workdir / rundir.LOCK_FILE).read_text():
        assert first.poll() is None and time.time() < deadline, first.stdout.read()
        time.sleep(0.05)
    second = celerity_train(workdir, *steps)
    out = second.communicate(timeout=300)[0]
    assert second.returncode == 2, out
    assert f"is in use by pid {first.pid} on host {socket.gethostname()}" in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out
    assert first.wait(timeout=300) == 0, first.stdout.read()
    assert sorted(curve_losses(workdir)) == list(range(1, 61))
    with open(workdir / "curve.csv") as f:
        assert len(f.readlines()) == 61  # header and one row per step: nothing duplicated
