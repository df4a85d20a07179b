"""Two processes on localhost (CPU, jax.distributed) train the same steps as one process."""

import os
import socket
import subprocess
import sys

import numpy as np

from celerity_jax.train import loop

STEPS = ("TrainConfig.stop_at_step = 10", "TrainConfig.eval_every = 0", "TrainConfig.checkpoint_every = 10")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(tmp_path, curve_losses, tiny_gin, repo_root, tiny_run):
    loop.train(tiny_run(*STEPS), str(tmp_path / "one"), log=lambda _: None)
    port = _free_port()
    cmd = [sys.executable, "-m", "celerity_jax.cli", "train", "--workdir", str(tmp_path / "two"),
           "--coordinator-address", f"localhost:{port}", "--num-processes", "2"]
    for g in tiny_gin:
        cmd += ["--gin-file", g]
    for p in STEPS:
        cmd += ["--gin-param", p]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen(cmd + ["--process-id", str(i)], cwd=repo_root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "step 10/" in outs[0] and "step 10/" not in outs[1]  # only process 0 reports
    one, two = curve_losses(tmp_path / "one"), curve_losses(tmp_path / "two")
    np.testing.assert_allclose([two[s] for s in range(1, 11)], [one[s] for s in range(1, 11)], rtol=1e-5)
    assert (tmp_path / "two" / "checkpoints" / "10").is_dir()


LOST_STEPS = ("TrainConfig.stop_at_step = 40", "TrainConfig.eval_every = 0", "TrainConfig.checkpoint_every = 10",
              "TrainConfig.log_every = 1")


def _start_two(workdir, tiny_gin, repo_root, stderr=subprocess.PIPE) -> list[subprocess.Popen]:
    """Both processes of the tiny run (LOST_STEPS), each in its own process group, a lost process noticed in 3 s."""
    port = _free_port()
    cmd = [sys.executable, "-m", "celerity_jax.cli", "train", "--workdir", str(workdir), "--coordinator-address",
           f"localhost:{port}", "--num-processes", "2", "--heartbeat-timeout", "3"]
    cmd += [a for g in tiny_gin for a in ("--gin-file", g)] + [a for p in LOST_STEPS for a in ("--gin-param", p)]
    return [subprocess.Popen(cmd + ["--process-id", str(i)], cwd=repo_root, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                             stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
            for i in range(2)]


def _lose_at_step_15(procs: list[subprocess.Popen], lost: int) -> tuple[subprocess.Popen, list[str], float]:
    """Kills the process group of procs[lost] (its host is gone) once process 0 has logged step 15; returns the
    survivor, its stderr lines and the seconds it took to stop."""
    import signal
    import threading
    import time

    printed = []
    reader = threading.Thread(target=lambda: printed.extend(procs[0].stdout))
    reader.start()
    deadline = time.time() + 300
    while not any(line.startswith("step 15/") for line in printed) and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(procs[lost].pid, signal.SIGKILL)
    killed = time.time()
    survivor = procs[1 - lost]
    err = survivor.communicate(timeout=120)[1].strip().splitlines()
    seconds = time.time() - killed
    reader.join()
    return survivor, err, seconds


def test_a_lost_process_stops_the_other_in_seconds_with_one_line_and_a_rerun_resumes(tmp_path, curve_losses, tiny_gin,
                                                                                     repo_root, tiny_run):
    loop.train(tiny_run(*LOST_STEPS), str(tmp_path / "one"), log=lambda _: None)
    survivor, err, seconds = _lose_at_step_15(_start_two(tmp_path / "two", tiny_gin, repo_root), lost=1)
    assert survivor.returncode == 5 and seconds < 30
    assert err[-1].startswith("celerity train: process 1 of this run sent no heartbeat for 3 s, so process 0 "
                              "stopped") and not any("Check failure stack trace" in line or "Traceback" in line for line in err), err
    procs = _start_two(tmp_path / "two", tiny_gin, repo_root, stderr=subprocess.STDOUT)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    one, two = curve_losses(tmp_path / "one"), curve_losses(tmp_path / "two")
    assert sorted(two) == list(range(1, 41))
    np.testing.assert_allclose([two[s] for s in range(1, 41)], [one[s] for s in range(1, 41)], rtol=1e-5)


def test_when_the_coordinator_is_lost_the_others_stop_with_one_line(tmp_path, tiny_gin, repo_root):
    survivor, err, seconds = _lose_at_step_15(_start_two(tmp_path / "run", tiny_gin, repo_root), lost=0)
    assert survivor.returncode == 5 and seconds < 30
    assert err[-1].startswith("celerity train: the run's coordinator (process 0) is gone or reported a failed "
                              "process, so process 1 stopped"), err
    assert not any("Check failure stack trace" in line or "Traceback" in line for line in err), err


def test_the_lost_processes_are_read_from_the_runtime_report():
    from celerity_jax.train.supervisor import lost_processes

    report = ["E1206 coordination_service.cc:1549] ... UNAVAILABLE: The following tasks are unhealthy (stopped "
              "sending heartbeats):\n", "1\n", "3\n", "The tasks have crashed. Check the task logs\n"]
    assert lost_processes(report) == [1, 3]
    assert lost_processes(["F1206 client.h:80] Terminating process because ...\n"]) == []


def test_the_trainer_ends_with_its_supervisor_killed_outright(tmp_path, tiny_gin, repo_root, gone_within):
    """A `kill -9` of the launched multi-host `celerity train` (the supervisor) also ends the trainer it started,
    which would otherwise train on as an orphan holding the accelerators and the run lock."""
    cmd = [sys.executable, "-m", "celerity_jax.cli", "train", "--workdir", str(tmp_path / "run"),
           "--coordinator-address", f"localhost:{_free_port()}", "--num-processes", "1", "--process-id", "0"]
    cmd += [a for g in tiny_gin for a in ("--gin-file", g)] + ["--gin-param", "TrainConfig.log_every = 1"]
    supervisor = subprocess.Popen(cmd, cwd=repo_root, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert next(line for line in supervisor.stdout if line.startswith("step "))  # the trainer is training
    with open(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children") as f:
        (trainer,) = map(int, f.read().split())
    supervisor.kill()
    supervisor.wait()
    assert gone_within(trainer, 10)


def test_a_traceback_is_dropped_when_the_runtime_then_aborts_and_passed_through_otherwise():
    import io

    from celerity_jax.train.supervisor import relay

    traceback = ["Traceback (most recent call last):\n", '  File "loop.py", line 1, in run\n',
                 "jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection reset by peer\n"]
    out = io.StringIO()
    lines, aborting = relay(["step 3/40\n", *traceback, "E1207 Polled an error from coordination service\n"], out)
    assert aborting and len(lines) == 5 and out.getvalue() == "step 3/40\n"
    out = io.StringIO()
    assert relay(["warning\n", *traceback], out) == (["warning\n", *traceback], False)
    assert out.getvalue() == "".join(["warning\n", *traceback])
