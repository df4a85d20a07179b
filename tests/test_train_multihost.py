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


def test_two_processes_match_one(tmp_path, tiny_configs, curve_losses, tiny_gin, repo_root):
    loop.train(tiny_configs(*STEPS), str(tmp_path / "one"), log=lambda _: None)
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


def test_a_lost_process_stops_the_other_in_seconds_with_one_line_and_a_rerun_resumes(tmp_path, tiny_configs,
                                                                                    curve_losses, tiny_gin, repo_root):
    import signal
    import threading
    import time

    steps = ("TrainConfig.stop_at_step = 40", "TrainConfig.eval_every = 0", "TrainConfig.checkpoint_every = 10",
             "TrainConfig.log_every = 1")
    loop.train(tiny_configs(*steps), str(tmp_path / "one"), log=lambda _: None)
    def command(process_id: int, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "celerity_jax.cli", "train", "--workdir", str(tmp_path / "two"),
               "--coordinator-address", f"localhost:{port}", "--num-processes", "2", "--process-id", str(process_id),
               "--heartbeat-timeout", "3"]
        return cmd + [a for g in tiny_gin for a in ("--gin-file", g)] + [a for p in steps for a in ("--gin-param", p)]

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    port = _free_port()
    procs = [subprocess.Popen(command(i, port), cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for i in range(2)]
    printed = []
    reader = threading.Thread(target=lambda: printed.extend(procs[0].stdout))
    reader.start()
    deadline = time.time() + 300
    while not any(line.startswith("step 15/") for line in printed) and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(procs[1].pid, signal.SIGKILL)  # the host of process 1 is lost: its supervisor and trainer
    killed = time.time()
    err = procs[0].communicate(timeout=120)[1].strip().splitlines()
    reader.join()
    assert procs[0].returncode == 5 and time.time() - killed < 30
    assert err[-1].startswith("celerity train: process 1 of this run sent no heartbeat for 3 s, so process 0 "
                              "stopped") and not any("Check failure stack trace" in line for line in err), err
    port = _free_port()
    procs = [subprocess.Popen(command(i, port), cwd=repo_root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    one, two = curve_losses(tmp_path / "one"), curve_losses(tmp_path / "two")
    assert sorted(two) == list(range(1, 41))
    np.testing.assert_allclose([two[s] for s in range(1, 41)], [one[s] for s in range(1, 41)], rtol=1e-5)


def test_the_lost_processes_are_read_from_the_runtime_report():
    from celerity_jax.train.supervisor import lost_processes

    report = ["E1206 coordination_service.cc:1549] ... UNAVAILABLE: The following tasks are unhealthy (stopped "
              "sending heartbeats):\n", "1\n", "3\n", "The tasks have crashed. Check the task logs\n"]
    assert lost_processes(report) == [1, 3]
    assert lost_processes(["F1206 client.h:80] Terminating process because ...\n"]) == []
