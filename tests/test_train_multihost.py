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
