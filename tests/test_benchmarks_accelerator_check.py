"""benchmarks/accelerator_check.sh --dry-run: the end-to-end pass (benchmarks/end_to_end.sh) on the CPU at its tiny
shape, as the GPU check runs it at a real one: BPE shards, a killed and resumed run, eval, sample, memory. About
a minute: slow (`make test-slow`)."""

import json
import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = "benchmarks/accelerator_check.sh"
TIMEOUT_S = 300


def _run(cmd, cwd, env) -> subprocess.CompletedProcess:
    """Runs `cmd` in its own process group, so that a timeout also ends the training runs the script started."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{SCRIPT} --dry-run ran past {TIMEOUT_S} s:\n{out}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("accelerator_check")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHON=sys.executable, OUT=str(out),
               TMPDIR=str(tmp_path_factory.mktemp("work")))
    done = _run(["bash", SCRIPT, "--dry-run"], repo_root, env)
    assert done.returncode == 0, done.stdout
    with open(out / "end_to_end.json") as f:
        return json.load(f), done.stdout, out


def test_the_dry_run_passes_every_check_and_writes_one_json(dry_run):
    result, stdout, out = dry_run
    assert result["mode"] == "dry-run" and result["ok"] and result["failures"] == [], result["failures"]
    assert result["device"]["platform"] == "cpu"
    assert sorted(os.listdir(out)) == ["end_to_end.json"]  # a device machine returns at most 8 files
    assert "== end-to-end pass (dry-run)" in stdout and "FAILED" not in stdout


def test_the_bpe_tokenizer_and_its_shards(dry_run):
    result = dry_run[0]
    assert result["bpe"]["vocab_size"] == 2048 and result["bpe"]["trained_on_files"] > 100
    prepared = result["prepare_data"]
    assert prepared["vocab_size"] == 2048
    assert prepared["splits"]["train"]["shards"] >= 2 and prepared["splits"]["val"]["shards"] >= 1
    assert prepared["splits"]["train"]["tokens"] > 5 * prepared["splits"]["val"]["tokens"] > 0
    assert len(prepared["files"]) == sum(s["shards"] for s in prepared["splits"].values())
    assert result["shape"]["vocab_size"] == 2048


def test_the_killed_and_resumed_curve_equals_the_uninterrupted_one(dry_run):
    train = dry_run[0]["train"]
    steps = dry_run[0]["shape"]["steps"]
    assert train["resumed_equals_uninterrupted"] and train["first_differing_step"] is None
    assert train["rows"] == train["uninterrupted_rows"] == steps
    assert train["killed_after_checkpoint"] <= train["resumed_from_step"] < steps
    assert train["final_loss"] < train["first_loss"]


def test_eval_and_sample_on_the_trained_run(dry_run):
    result = dry_run[0]
    score = result["eval"]
    assert score["task"] == "stdlib_next_line" and score["docs"] > 0 and 0 <= score["value"] <= 1
    samples = result["sample"]["samples"]
    assert result["sample"]["temperature"] == 0 and len(samples) == 3
    assert all(s["new_tokens"] > 0 for s in samples) and any(s["completion"].strip() for s in samples)


def test_memory_says_why_nothing_is_measured_or_planned_on_the_cpu(dry_run):
    memory = dry_run[0]["memory"]
    assert memory["measured"]["peak_bytes_in_use"] is None
    assert memory["measured"]["reason"].startswith("not measured on CPU")
    assert memory["planned"]["bytes_per_chip"] is None and "topology" in memory["planned"]["reason"]
