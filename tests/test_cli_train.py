"""`celerity train`: its flags, and what it prints."""

import argparse
import subprocess
import sys

from celerity_jax import run
from celerity_jax.cli import train as train_cli


def _parse(argv):
    parser = argparse.ArgumentParser()
    train_cli.add_commands(parser.add_subparsers())
    return parser.parse_args(argv)


def test_dash_flags_and_the_underscore_aliases_mean_the_same():
    dashes = _parse(["train", "--workdir", "w", "--gin-file", "a.gin", "--gin-file", "b.gin", "--gin-param", "X.y = 1",
                     "--force-new", "--coordinator-address", "host:1", "--num-processes", "2", "--process-id", "1"])
    underscores = _parse(["train", "--workdir", "w", "--gin_file", "a.gin", "--gin_file", "b.gin", "--gin_param",
                          "X.y = 1", "--force_new", "--coordinator-address", "host:1", "--num-processes", "2",
                          "--process-id", "1"])
    assert vars(dashes) == vars(underscores)
    assert dashes.gin_file == ["a.gin", "b.gin"] and dashes.gin_param == ["X.y = 1"] and dashes.force_new
    assert (dashes.coordinator_address, dashes.num_processes, dashes.process_id) == ("host:1", 2, 1)


def test_a_run_at_its_last_step_already_says_so(tmp_path, tiny_gin, repo_root):
    bindings = ("TrainConfig.stop_at_step = 3",)
    run.load(run.RunSpec(str(tmp_path / "run"), tiny_gin, bindings)).train_to(log=lambda _: None)
    cmd = [sys.executable, "-m", "celerity_jax.cli", "train", "--workdir", str(tmp_path / "run"),
           "--gin_param", bindings[0]]
    for path in tiny_gin:
        cmd += ["--gin_file", path]
    result = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"nothing to train: {tmp_path / 'run'} is at step 3/114, its last step\n"
