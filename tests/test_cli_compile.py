"""`celerity compile` on the command line: text, JSON and one-line errors."""

import json
import signal
import subprocess
import sys

import pytest

from celerity_jax.train.interrupts import EXIT_CODE
from conftest import _CELERITY


@pytest.fixture
def celerity_compile(repo_root, tiny_gin):
    """(*args, files=every gin file of the tiny run) -> the finished `celerity compile` with those arguments."""
    def run(*args, files=tiny_gin):
        gin = [arg for path in files for arg in ("--gin-file", path)]
        return subprocess.run([sys.executable, "-m", "celerity_jax.cli", "compile", *gin, *args], cwd=repo_root,
                              capture_output=True, text=True)

    return run


def test_cli_names_the_fix_when_no_mesh_splits_the_batch(tmp_path, tpu_slice, celerity_compile):
    out = celerity_compile("--gin-param", "RecipeConfig.batch_seqs = 6", "--topology", tpu_slice, "--search",
                           "--cache-dir", str(tmp_path))
    assert out.returncode == 1 and "RecipeConfig.batch_seqs" in out.stdout


@pytest.mark.slow  # 13 s
def test_cli_prints_json_with_every_key(tmp_path, tpu_slice, report_keys, celerity_compile):
    out = celerity_compile("--topology", tpu_slice, "--json", "--cache-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report_keys <= set(report) and report["fits"]
    assert "TPU" not in out.stderr  # no libtpu start-up noise


def test_cli_bad_topology_is_one_line(tiny_gin, celerity_compile):
    out = celerity_compile("--topology", "v5p-7", files=tiny_gin[:1])
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "v5p-8" in out.stderr


def test_cli_refuses_an_unwritable_json_path_before_compiling(tmp_path, tpu_slice, tiny_gin, celerity_compile):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = celerity_compile("--topology", tpu_slice, "--json", str(blocker / "out.json"), files=tiny_gin[:1])
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--json" in out.stderr


def test_cli_reports_a_step_that_does_not_fit_with_the_fix(tmp_path, tpu_slice, too_big, celerity_compile):
    params = [arg for p in too_big for arg in ("--gin-param", p)]
    out = celerity_compile(*params, "--topology", tpu_slice, "--cache-dir", str(tmp_path))
    assert out.returncode == 1 and "DOES NOT FIT" in out.stdout
    assert "fix       raise TrainConfig.microbatches (now 1; at most 16" in out.stdout


def test_cli_states_the_dims_the_mesh_does_not_split(tmp_path, tpu_slice, celerity_compile):
    out = celerity_compile("--gin-param", "TrainConfig.mesh_shape = (1, 1, 4)", "--topology", tpu_slice,
                           "--cache-dir", str(tmp_path))
    setting = next(line for line in out.stdout.splitlines() if line.startswith("setting"))
    assert out.returncode == 0 and setting.endswith(
        "; kept whole, the mesh axis does not divide them: vocab (257) over tensor (4), attention heads 3 and kv "
        "heads 3 over tensor (4), which must divide the heads and divide or be divided by the kv heads")


def test_cli_budget_and_jobs_belong_to_search(tpu_slice, celerity_compile):
    out = celerity_compile("--topology", tpu_slice, "--budget", "1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--search" in out.stderr
    out = celerity_compile("--topology", tpu_slice, "--search", "--jobs", "0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--jobs" in out.stderr


def test_ctrl_c_stops_a_search_with_the_best_so_far_and_keeps_the_cache(tmp_path, tpu_slice, tiny_gin, repo_root):
    cache = tmp_path / "cache"
    gin = [arg for path in tiny_gin for arg in ("--gin-file", path)]
    proc = subprocess.Popen([sys.executable, "-c", _CELERITY, "compile", *gin, "--topology", tpu_slice, "--search",
                             "--jobs", "2", "--cache-dir", str(cache)], cwd=repo_root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # the first estimate, then Ctrl-C
        lines.append(line)
        if " est " in line:
            break
    proc.send_signal(signal.SIGINT)
    out = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == EXIT_CODE, out
    assert "STOPPED EARLY (Ctrl-C)" in out and "best so far: mesh" in out and "Traceback" not in out
    assert "Raising signal" not in out  # the stopped workers' crash reports stay out of the search's output
    assert list(cache.iterdir())  # the compiles finished so far are kept
