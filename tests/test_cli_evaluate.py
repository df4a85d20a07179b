import errno
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from celerity_jax.cli import main


def _contents(folder) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None for a folder): to check a command left it as it found it."""
    out = {}
    for parent, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(parent, name)
            out[os.path.relpath(path, folder)] = None if name in folders else pathlib.Path(path).read_bytes()
    return out


def _outputs(tmp_path, monkeypatch) -> None:
    """Under tmp_path: a file, a folder named like a JSON file, and a folder nobody may write (for root too)."""
    (tmp_path / "a_file").write_text("x\n")
    (tmp_path / "a_folder.json").mkdir()
    (tmp_path / "read_only").mkdir(mode=0o555)
    if os.geteuid() == 0:  # root writes anywhere: let the permission check see the folder as another user would
        real = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: real(path, mode, **kw) and
                            os.path.abspath(path) != str(tmp_path / "read_only"))


BAD_JSON = [
    (["--json", "{tmp}/missing/out.json"], "--json {tmp}/missing/out.json: {tmp}/missing is not an existing folder"),
    (["--json", "{tmp}/a_folder.json"], "--json {tmp}/a_folder.json is a folder; give a file path"),
    (["--json", "{tmp}/a_file/out.json"], "--json {tmp}/a_file/out.json: {tmp}/a_file is not an existing folder"),
    (["--json", "{tmp}/read_only/out.json"], "the folder {tmp}/read_only is not writable"),
    (["--json", ""], "--json '' names no file; give a file path"),
]


def test_greedy_sampling_is_repeatable_and_written_as_json(trained_run, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("import os\n\ndef main(\n")
    args = ["sample", "--workdir", trained_run, "--prompts-file", str(prompts), "--max-new-tokens", "12",
            "--stop", "\n", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == first
    assert first["step"] == 114 and [s["prompt"] for s in first["samples"]] == ["import os", "def main("]
    for s in first["samples"]:
        assert "\n" not in s["completion"] and s["stopped"] in ("stop", "max_new_tokens", "end_of_text")
        assert s["new_tokens"] <= 12


def test_sampling_at_a_temperature_follows_the_seed(trained_run, capsys):
    def sample(seed):
        assert main(["sample", "--workdir", trained_run, "--step", "110", "--prompt", "x = ", "--temperature", "1.0",
                     "--top-p", "0.9", "--seed", str(seed), "--max-new-tokens", "24", "--json"]) == 0
        return json.loads(capsys.readouterr().out)["samples"][0]["completion"]

    assert sample(1) == sample(1) and sample(1) != sample(2)


@pytest.mark.parametrize("args, message", [
    (["--prompt", "x" * 300], "prompt 1 is 300 tokens, and the model reads at most 256"),
    ([], "give prompts with --prompt TEXT (repeatable) or --prompts-file F"),
    (["--prompt", "a", "--prompts-file", "p.txt"], "give prompts with --prompt TEXT"),
    (["--prompt", "a", "--top-p", "0"], "--top-p=0.0 in (0, 1]"),
    (["--prompt", "a", "--temperature", "nan"], "--temperature=nan must be a finite number >= 0"),
    (["--prompt", "a", "--temperature", "inf"], "--temperature=inf must be a finite number >= 0"),
    (["--prompt", "a", "--seed", "1180591620717411303424"], "--seed=1180591620717411303424 must be a whole number"),
    (["--prompt", "a", "--stop", ""], "--stop got an empty string"),
    (["--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens=0 must be a positive whole number"),
    *[(["--prompt", "a", *args], message) for args, message in BAD_JSON],
])
def test_bad_input_gives_one_line(args, message, trained_run, tmp_path, monkeypatch, capsys):
    _outputs(tmp_path, monkeypatch)
    before = _contents(trained_run)
    assert main(["sample", "--workdir", trained_run, *[a.format(tmp=tmp_path) for a in args]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(tmp=tmp_path) in err[0], err
    assert _contents(trained_run) == before


def _arc_document(i: int, **change) -> dict:
    return {"id": f"q{i}", "question": f"what is {i} plus one?", "answerKey": "ABCD"[i % 4],
            "choices": {"text": [str(i + k) for k in range(4)], "label": list("ABCD")}, **change}


def _write_arc_easy(data_dir, **lines_by_split) -> str:
    """DIR/arc_easy/<split>.jsonl: 6 training documents and 3 in each other split, or the lines given."""
    splits = {"train": [_arc_document(i) for i in range(6)], "validation": [_arc_document(i) for i in range(3)],
              "test": [_arc_document(i) for i in range(3)], **lines_by_split}
    os.makedirs(os.path.join(data_dir, "arc_easy"), exist_ok=True)
    for split, lines in splits.items():
        with open(os.path.join(data_dir, "arc_easy", f"{split}.jsonl"), "wb") as f:
            f.write(b"".join(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n" for line in lines))
    return str(data_dir)


@pytest.fixture
def run_copy(trained_run, tmp_path) -> str:
    """A copy of the trained run, which a test may change."""
    shutil.copytree(trained_run, tmp_path / "run")
    return str(tmp_path / "run")


def _truncate_newest_checkpoint(workdir: str) -> None:
    """Cuts every data file of the step-114 state short (which file holds the parameters varies)."""
    state = os.path.join(workdir, "checkpoints", "114", "state")
    for parent, _, names in os.walk(state):
        for name in names:
            if os.path.basename(parent) == "d":
                os.truncate(os.path.join(parent, name), 100)


# orbax leaves the coroutines of a failed read to the garbage collector, which reports each
ORBAX_FAILED_READS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

BAD_TEST_SPLIT = {
    "blank": [b"\n", b"  \n"],
    "latin1": [_arc_document(0), b'{"question": "caf\xe9"}\n'],
    "choices_string": [_arc_document(0, choices="A) 1 B) 2 C) 3 D) 4")],
    "bad_answer": [_arc_document(0), _arc_document(1, answerKey="E")],
}


@pytest.mark.parametrize("broken, args, message", [
    *[(None, args, message) for args, message in BAD_JSON],
    (None, ["--tasks", "arc_easy:1000"], "--tasks arc_easy:1000: {data}/arc_easy/train.jsonl gives at most 6 few-shot "
                                         "examples; ask for 6 or fewer shots"),
    ("blank", [], "arc_easy/test.jsonl holds no document"),
    ("latin1", [], "arc_easy/test.jsonl:2 is not UTF-8 text (byte 0xe9); save the file as UTF-8"),
    ("choices_string", [], "arc_easy/test.jsonl:1 is not one JSON object per line with the fields question, choices, "
                           "answerKey (choices is not an object)"),
    ("bad_answer", [], "arc_easy/test.jsonl:2 is not one JSON object per line with the fields question, choices, "
                       "answerKey (answerKey 'E' is none of 'A', 'B', 'C', 'D')"),
    pytest.param("checkpoint", [], "cannot read the parameters of the checkpoint at step 114",
                 marks=ORBAX_FAILED_READS),
])
def test_bad_eval_input_gives_one_line_and_leaves_the_run_as_it_was(broken, args, message, run_copy, tmp_path,
                                                                    monkeypatch, capsys):
    _outputs(tmp_path, monkeypatch)
    data = _write_arc_easy(tmp_path / "data", **({"test": BAD_TEST_SPLIT[broken]} if broken in BAD_TEST_SPLIT else {}))
    if broken == "checkpoint":
        _truncate_newest_checkpoint(run_copy)
    before = _contents(run_copy)
    command = ["eval", "--workdir", run_copy, "--tasks", "arc_easy", "--data-dir", data]
    assert main([*command, *[a.format(tmp=tmp_path) for a in args]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(tmp=tmp_path, data=data) in err[0], err
    assert _contents(run_copy) == before


@ORBAX_FAILED_READS
def test_a_corrupt_checkpoint_is_refused_in_one_line_alone(run_copy, repo_root):
    """Not orbax's traceback logged before it (as it was), nor the reads orbax abandoned as they complete later."""
    from celerity_jax.errors import ConfigError
    from celerity_jax.evaluate import loader

    _truncate_newest_checkpoint(run_copy)
    out = subprocess.run([sys.executable, "-m", "celerity_jax.cli", "sample", "--workdir", run_copy, "--prompt", "a"],
                         cwd=repo_root, capture_output=True, text=True, timeout=300)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, out.stderr[-3000:]
    assert "cannot read the parameters of the checkpoint at step 114" in err[0]
    with pytest.raises(ConfigError) as refusal:
        loader.load_model(run_copy)
    assert refusal.value.__cause__ is not None  # orbax's error, for CELERITY_VERBOSE=1


def test_eval_writes_the_run_directory_only_after_its_json(run_copy, tmp_path, monkeypatch, capsys):
    """--json is written first: where it fails (here a full disk), the run directory is as it was."""
    from celerity_jax.cli import options

    data = _write_arc_easy(tmp_path / "data")
    command = ["eval", "--workdir", run_copy, "--tasks", "arc_easy", "--data-dir", data, "--json",
               str(tmp_path / "scores.json")]
    before = _contents(run_copy)

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(options, "write_text_atomic", disk_full)
    assert main(command) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert _contents(run_copy) == before and not (tmp_path / "scores.json").exists()
    monkeypatch.undo()
    assert main(command) == 0
    written = json.loads((tmp_path / "scores.json").read_text())
    assert written["tasks"]["arc_easy"]["docs"] == 3
    assert written == json.loads(pathlib.Path(run_copy, "downstream", "step_114.json").read_text())
    new = set(_contents(run_copy)) - set(before)
    assert "downstream/step_114.json" in new and any(n.startswith("events.out.tfevents") for n in new)
