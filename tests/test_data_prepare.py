import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from celerity_jax.data import arrayrecord, corpus, prepare
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import train_bpe
from celerity_jax.errors import ConfigError


@pytest.fixture(scope="module")
def text_cfg(tmp_path_factory) -> DataConfig:
    root = tmp_path_factory.mktemp("text")
    for i in range(20):
        (root / f"doc{i:02d}.txt").write_text(f"document {i}: " + "spam and eggs " * (5 + 7 * i))
    (root / "records.jsonl").write_text("".join(json.dumps({"text": f"record {i} " * 9}) + "\n" for i in range(40))
                                        + "not json\n")
    return DataConfig(source="text", paths=(str(root),), val_fraction=0.3)


@pytest.fixture
def small_tasks(monkeypatch):
    monkeypatch.setattr(corpus, "TASK_BYTES", 300)


def _files(folder) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def test_cut_groups_closes_a_group_at_the_first_task_past_the_size():
    assert list(prepare.cut_groups([3, 4, 1, 9, 2], 5)) == [(0, 2), (2, 4), (4, 5)]
    assert list(prepare.cut_groups([5, 5], 5)) == [(0, 1), (1, 2)]
    assert list(prepare.cut_groups([], 5)) == []


def test_the_folder_is_identical_for_one_and_two_workers(text_cfg, small_tasks, tmp_path):
    one = prepare.prepare(text_cfg, str(tmp_path / "one"), chunk_tokens=64, shard_tokens=700, workers=1)
    two = prepare.prepare(text_cfg, str(tmp_path / "two"), chunk_tokens=64, shard_tokens=700, workers=2)
    assert len(one["splits"]["train"]["shards"]) >= 4
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    assert one["closing"].endswith("21/21 files") and two["summary"] == one["summary"]


def test_the_manifest_lists_sources_counts_and_shards(text_cfg, tmp_path):
    manifest = prepare.prepare(text_cfg, str(tmp_path / "out"), chunk_tokens=64, shard_tokens=10**9)
    with open(tmp_path / "out" / arrayrecord.MANIFEST) as f:
        assert json.load(f) == {k: v for k, v in manifest.items() if k != "closing"}
    files = sorted(os.listdir(text_cfg.paths[0]))
    assert [os.path.basename(s["path"]) for s in manifest["sources"]] == files
    first = manifest["sources"][0]
    assert first["bytes"] == os.path.getsize(first["path"]) and first["mtime"] == os.path.getmtime(first["path"])
    read = manifest["read"]
    assert read["files"] == 21 and read["documents"]["train"] + read["documents"]["val"] == 60
    assert read["skipped"] == 1 and read["skipped_examples"] == [f"{text_cfg.paths[0]}/records.jsonl:41: not JSON "
                                                                 "(Expecting value)"]
    assert [s["file"] for s in manifest["splits"]["train"]["shards"]] == ["train-00000.arrayrecord"]
    assert manifest["splits"]["val"]["shards"][0]["tokens"] == manifest["splits"]["val"]["tokens"] > 0
    assert manifest["settings"]["text_column"] == "text" and manifest["shard_tokens"] == 10**9


def test_a_failed_prepare_leaves_nothing_and_a_rerun_works(text_cfg, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "only.txt").write_text("the one document " * 20)
    out = tmp_path / "new" / "shards"
    with pytest.raises(ConfigError, match="every document fell into the validation split"):
        prepare.prepare(DataConfig(source="text", paths=(str(tmp_path / "docs"),), val_fraction=0.999999), str(out))
    assert os.listdir(tmp_path / "new") == []  # neither --out nor the hidden partial folder
    with pytest.raises(ConfigError, match="records.jsonl:41: not JSON"):
        prepare.prepare(DataConfig(source="text", paths=text_cfg.paths, on_bad_record="fail"), str(out))
    assert os.listdir(tmp_path / "new") == []
    assert prepare.prepare(text_cfg, str(out))["splits"]["train"]["tokens"] > 0
    assert (out / arrayrecord.MANIFEST).exists() and os.listdir(tmp_path / "new") == ["shards"]


def test_a_stopped_prepare_resumes_to_the_same_folder_and_refuses_other_settings(text_cfg, small_tasks, tmp_path,
                                                                                 monkeypatch):
    prepare.prepare(text_cfg, str(tmp_path / "whole"), chunk_tokens=64, shard_tokens=700)
    write_group = arrayrecord.write_group
    written = []

    def stop_at_the_third_group(folder, group, *args):
        if group == 2:
            raise KeyboardInterrupt
        written.append(group)
        return write_group(folder, group, *args)

    monkeypatch.setattr(arrayrecord, "write_group", stop_at_the_third_group)
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare(text_cfg, str(tmp_path / "out"), chunk_tokens=64, shard_tokens=700, stream=stream)
    assert written == [0, 1] and "stopped after 2 shard groups; rerun the same command" in stream.getvalue()
    assert sorted(os.listdir(tmp_path)) == [".out.partial", "whole"]
    monkeypatch.setattr(arrayrecord, "write_group", write_group)
    with pytest.raises(ConfigError, match=r"\.out\.partial holds an unfinished prepare-data whose shard_tokens differ"):
        prepare.prepare(text_cfg, str(tmp_path / "out"), chunk_tokens=64, shard_tokens=900)
    journal = tmp_path / ".out.partial" / prepare.PROGRESS
    saved = journal.read_text()
    journal.write_text("{")
    with pytest.raises(ConfigError, match=r"progress.json is unreadable .*; delete .*\.out\.partial to start over"):
        prepare.prepare(text_cfg, str(tmp_path / "out"), chunk_tokens=64, shard_tokens=700)
    journal.write_text(saved)
    stream = io.StringIO()
    prepare.prepare(text_cfg, str(tmp_path / "out"), chunk_tokens=64, shard_tokens=700, stream=stream)
    assert "resuming" in stream.getvalue() and "2 shard groups" in stream.getvalue()
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")
    assert sorted(os.listdir(tmp_path)) == ["out", "whole"]


def test_a_killed_prepare_data_resumes_to_the_same_folder(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = [f"document {i} " + " ".join(f"word{(i * j) % 977}" for j in range(3000)) for i in range(480)]
    for k in range(8):  # eight files of more than corpus.TASK_BYTES: eight tasks
        with open(docs / f"part{k}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts[k::8])
    tokenizer = train_bpe(texts[:20], 400, str(tmp_path / "tokenizer.json"))
    command = [sys.executable, "-m", "celerity_jax.cli", "prepare-data", "--input", str(docs), "--tokenizer",
               tokenizer, "--chunk-tokens", "512", "--shard-tokens", "20000", "--workers", "1"]
    subprocess.run(command + ["--out", str(tmp_path / "whole")], check=True, capture_output=True)
    groups = len(json.load(open(tmp_path / "whole" / arrayrecord.MANIFEST))["splits"]["train"]["shards"])
    assert groups == 8

    killed = subprocess.Popen(command + ["--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    journal = tmp_path / ".out.partial" / prepare.PROGRESS
    deadline = time.monotonic() + 60
    while not journal.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    done = json.load(open(journal))["groups"]
    assert 1 <= done < groups and not (tmp_path / "out").exists()
    resumed = subprocess.run(command + ["--out", str(tmp_path / "out")], check=True, capture_output=True, text=True)
    assert f"resuming {tmp_path / '.out.partial'}: {done} shard groups" in resumed.stderr
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")


def test_prepare_replaces_an_empty_folder_but_not_one_filled_meanwhile(text_cfg, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    prepare.prepare(text_cfg, str(out))
    assert (out / arrayrecord.MANIFEST).exists()

    write_groups = prepare._write_groups

    def someone_else_writes_too(*args):
        (tmp_path / "busy" / "theirs.txt").write_text("x")
        return write_groups(*args)

    (tmp_path / "busy").mkdir()
    monkeypatch.setattr(prepare, "_write_groups", someone_else_writes_too)
    with pytest.raises(ConfigError, match=r"busy: the finished folder cannot be renamed to it .*; it is complete at "
                                          r".*\.busy\.partial: move it"):
        prepare.prepare(text_cfg, str(tmp_path / "busy"))
    assert os.listdir(tmp_path / "busy") == ["theirs.txt"]
    assert sorted(os.listdir(tmp_path)) == [".busy.partial", "busy", "out"]
    assert _files(tmp_path / ".busy.partial").keys() == {*_files(out), prepare.PROGRESS}


@pytest.mark.parametrize("out, problem", [
    ("gs://bucket/shards", "--out gs://bucket/shards is a URL, but ArrayRecord writes local files only"),
    ("file", "--out {}/file is a file, not a folder"),
    ("file/sub", "{}/file is a file, not a folder, so no folder can be made under it"),
    (".", "--out . is the working directory"),
])
def test_prepare_refuses_outputs_it_cannot_make(text_cfg, tmp_path, monkeypatch, out, problem):
    (tmp_path / "file").write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=problem.format(tmp_path)):
        prepare.prepare(text_cfg, out if out == "." or "://" in out else str(tmp_path / out))
    assert os.listdir(tmp_path) == ["file"]


@pytest.mark.parametrize("kwargs, problem", [
    ({"chunk_tokens": 0}, "--chunk-tokens=0 and --shard-tokens=.* must be positive"),
    ({"shard_tokens": -1}, "--shard-tokens=-1 must be positive"),
    ({"workers": 0}, "--workers=0 must be at least 1"),
])
def test_bad_sizes_are_refused(text_cfg, tmp_path, kwargs, problem):
    with pytest.raises(ConfigError, match=problem):
        prepare.prepare(text_cfg, str(tmp_path / "out"), **kwargs)
    assert os.listdir(tmp_path) == []
