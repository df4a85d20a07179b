"""The output folder of an export or import: a new or empty folder, filled whole or not at all."""

import os
import socket
import subprocess
import sys

import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.hf import outdir


def test_a_folder_that_holds_anything_is_refused(tmp_path):
    outdir.check_empty(str(tmp_path / "new"), "--out")
    outdir.check_empty(str(tmp_path), "--out")
    (tmp_path / "x").write_text("x")
    with pytest.raises(ConfigError, match=r"--out .* is not empty; give a new or empty folder"):
        outdir.check_empty(str(tmp_path), "--out")


def test_the_folder_appears_complete_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    with outdir.building(str(out), "--out") as partial:
        assert os.path.basename(partial).startswith(".out.partial-") and not out.exists()
        (tmp_path / partial / "weights").write_text("w")
    assert os.listdir(tmp_path) == ["out"] and (out / "weights").read_text() == "w"
    failed = tmp_path / "failed"
    with pytest.raises(RuntimeError), outdir.building(str(failed), "--out") as partial:
        (tmp_path / partial / "weights").write_text("w")
        raise RuntimeError("the writer failed")
    assert os.listdir(tmp_path) == ["out"]


def test_the_partial_folders_of_gone_processes_are_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    host, running = socket.gethostname(), os.getppid()
    kept = [f".out.partial-{host}-{running}", f".other.partial-{host}-{gone.pid}",
            f".out.partial-another-host-{gone.pid}"]  # another host's process cannot be judged from here
    for name in [f".out.partial-{host}-{gone.pid}", *kept]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_text("w")
    with outdir.building(str(tmp_path / "out"), "--out"):
        pass
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, "out"])


def test_an_output_filled_by_another_command_meanwhile_is_one_line(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"--out .*/out was filled by another command while this one ran"):
        with outdir.building(str(out), "--out") as partial:
            (tmp_path / partial / "weights").write_text("mine")
            out.mkdir()
            (out / "weights").write_text("theirs")
    assert os.listdir(tmp_path) == ["out"] and (out / "weights").read_text() == "theirs"
