import json
import os

import pytest

from celerity_jax import cli


def test_prepare_data_writes_shards_and_says_how_to_train_on_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths: the hash split of "a.jsonl:N" is the same in every run
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"body": f"record {i} " * 20}) + "\n" for i in range(30)))
    out = "shards"
    assert cli.main(["prepare-data", "--input", "a.jsonl", "--text-column", "body", "--out", out,
                     "--chunk-tokens", "256", "--workers", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("prepare-data: ") and "tokens/s), 1/1 files" in printed[0]
    assert printed[1] == "prepare-data: 1 files, 29 train / 1 val documents"
    summary = json.loads(printed[2])
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    assert summary["splits"]["train"]["tokens"] == manifest["splits"]["train"]["tokens"] > 0
    assert manifest["chunk_tokens"] == 256 and manifest["settings"]["text_column"] == "body"
    assert printed[3] == (f"train with DataConfig.source = 'arrayrecord', DataConfig.paths = ['{out}'] and "
                          "DataConfig.tokenizer = 'byte'")


def test_prepare_data_reports_bad_input_without_a_traceback(tmp_path, capsys):
    assert cli.main(["prepare-data", "--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "celerity prepare-data: error: --input: " in err and "missing.txt" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags, lines, message", [
    (["--val-fraction", "2"], None, "error: --val-fraction=2.0 must lie strictly between 0 and 1"),
    (["--on-bad-record", "fail"], '{"text": "a"}\nnot json\n', "fix or remove it, or set --on-bad-record skip to skip"),
    (["--text-column", "body"], '{"text": "a"}\n', "(--text-column))); check the text column (--text-column='body')"),
])
def test_prepare_data_errors_name_the_flags_typed(tmp_path, capsys, flags, lines, message):
    source = tmp_path / "a.jsonl"
    source.write_text(lines or '{"text": "a"}\n')
    assert cli.main(["prepare-data", "--input", str(source), *flags, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "DataConfig" not in err[0], err
    assert not (tmp_path / "o").exists()


def _prepare(capsys, *argv) -> tuple[int, str]:
    code = cli.main(["prepare-data", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == (code != 0)
    return code, err


def test_prepare_data_refuses_a_file_as_out(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("some text " * 50)
    code, err = _prepare(capsys, "--input", str(tmp_path / "a.txt"), "--out", str(tmp_path / "a.txt"))
    assert code == 2 and f"--out {tmp_path / 'a.txt'} is a file, not a folder" in err


def test_failed_prepare_data_leaves_nothing_and_can_be_rerun(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    # More documents than one tokenizer batch: the bad file is met after the first shards were written.
    (docs / "a.jsonl").write_text("".join(json.dumps({"text": f"record {i} " * 5}) + "\n" for i in range(600)))
    (docs / "b.txt").write_bytes(b"\x00\x01 binary")
    (docs / "one.txt").write_text("a single document " * 20)
    out = tmp_path / "shards"
    code, err = _prepare(capsys, "--input", str(docs / "a.jsonl"), str(docs / "b.txt"), "--on-bad-record", "fail",
                         "--out", str(out))
    assert code == 2 and "b.txt: binary" in err and os.listdir(tmp_path) == ["docs"]
    code, err = _prepare(capsys, "--input", str(docs / "one.txt"), "--val-fraction", "0.999999", "--out", str(out))
    assert code == 2 and "every document fell into the validation split" in err and os.listdir(tmp_path) == ["docs"]
    code, _ = _prepare(capsys, "--input", str(docs / "a.jsonl"), "--out", str(out))
    assert code == 0 and (out / "manifest.json").exists() and sorted(os.listdir(tmp_path)) == ["docs", "shards"]


def test_beam_options_need_the_beam_runner(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("some text " * 50)
    code, err = _prepare(capsys, "--input", str(tmp_path / "a.txt"), "--out", str(tmp_path / "o"), "--",
                         "--runner=DirectRunner")
    assert code == 2 and "Beam options ['--runner=DirectRunner'] were given but --runner is 'local'" in err


def test_prepare_data_keeps_the_default_allocator_that_other_commands_change(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(cli.hostmem, "retain_freed_memory", lambda: calls.append(1))
    assert cli.main(["prepare-data", "--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    assert calls == []  # one malloc arena would serialize the tokenizer's threads
    assert cli.main(["tau", "--batch-tokens", "4194304", "--lr", "3e-4", "--wd", "0.1", "--tokens", "2e12"]) == 0
    assert calls == [1]


def test_a_failed_shard_write_stops_in_one_line_and_can_be_resumed(tmp_path, capsys, monkeypatch):
    def full_disk(path, options):
        raise RuntimeError("open() failed: No space left on device")

    (tmp_path / "a.txt").write_text("some text " * 50)
    (tmp_path / "v.txt").write_text("held out " * 50)
    monkeypatch.setattr("celerity_jax.data.arrayrecord.array_record_module.ArrayRecordWriter", full_disk)
    code = cli.main(["prepare-data", "--input", str(tmp_path / "a.txt"), "--val-input", str(tmp_path / "v.txt"),
                     "--out", str(tmp_path / "o"), "--workers", "1"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and "Traceback" not in "\n".join(err)
    assert err == [f"prepare-data: stopped after 0 shard groups; rerun the same command to resume from "
                   f"{tmp_path / '.o.partial'}",
                   f"celerity prepare-data: writing the shard {tmp_path / '.o.partial' / 'train-00000.arrayrecord'} "
                   "failed (open() failed: No space left on device); fix the disk or folder, then rerun the same "
                   "command to resume"]
