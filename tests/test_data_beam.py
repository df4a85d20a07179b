import json
import os
import subprocess
import sys

import pytest

from celerity_jax import cli
from celerity_jax.data import arrayrecord, beam, corpus, prepare
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import train_bpe
from celerity_jax.errors import ConfigError

DIRECT = ["--runner=DirectRunner"]


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> dict:
    """A mixed corpus (.txt files, a .jsonl with a malformed line) and a small BPE tokenizer trained on it."""
    root = tmp_path_factory.mktemp("beam")
    texts = [f"document {i}: " + " ".join(f"word{(i * j) % 53}" for j in range(20 + 9 * i)) for i in range(12)]
    (root / "docs").mkdir()
    for i, text in enumerate(texts):
        (root / "docs" / f"doc{i:02d}.txt").write_text(text)
    records = "".join(json.dumps({"text": f"record {i} " + texts[i % 12][:120]}) + "\n" for i in range(30))
    (root / "docs" / "records.jsonl").write_text(records + "not json\n")
    return {"folder": str(root / "docs"), "tokenizer": train_bpe(texts, 300, str(root / "tokenizer.json"))}


@pytest.fixture(autouse=True)
def small_tasks(monkeypatch):
    monkeypatch.setattr(corpus, "TASK_BYTES", 300)


def _files(folder) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def test_the_beam_folder_is_byte_identical_to_the_local_one(docs, tmp_path):
    cfg = DataConfig(source="text", paths=(docs["folder"],), tokenizer=docs["tokenizer"], val_fraction=0.3)
    local = prepare.prepare(cfg, str(tmp_path / "local"), chunk_tokens=32, shard_tokens=300, workers=1)
    manifest = beam.prepare_with_beam(cfg, str(tmp_path / "beam"), chunk_tokens=32, shard_tokens=300,
                                      beam_options=DIRECT)
    assert len(manifest["splits"]["train"]["shards"]) >= 3 and manifest["splits"]["val"]["shards"]
    assert manifest["read"]["skipped_examples"] == [f"{docs['folder']}/records.jsonl:31: not JSON (Expecting value)"]
    assert manifest == {k: v for k, v in local.items() if k != "closing"}
    assert _files(tmp_path / "beam") == _files(tmp_path / "local")
    assert sorted(os.listdir(tmp_path)) == ["beam", "local"]


def test_prepare_data_runs_on_beam_through_the_cli(docs, tmp_path, capsys):
    out = tmp_path / "shards"
    assert cli.main(["prepare-data", "--input", docs["folder"], "--tokenizer", docs["tokenizer"], "--out", str(out),
                     "--chunk-tokens", "32", "--shard-tokens", "300", "--runner", "beam", "--", *DIRECT]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("prepare-data: 13 files, ") and printed[0].endswith(
        f"val documents, 1 skipped ({docs['folder']}/records.jsonl:31: not JSON (Expecting value))")
    assert json.loads(printed[1])["vocab_size"] == 300
    manifest = json.loads((out / arrayrecord.MANIFEST).read_text())
    assert sum(manifest["read"]["documents"].values()) == 42  # 12 .txt files and 30 good .jsonl lines
    assert os.listdir(tmp_path) == ["shards"]


def test_a_bad_input_under_beam_prints_one_line_and_leaves_nothing(docs, tmp_path):
    # A subprocess: the real stderr, where Beam's own logging would show (pytest captures logging in-process).
    out = tmp_path / "new" / "shards"
    command = [sys.executable, "-m", "celerity_jax.cli", "prepare-data", "--input", docs["folder"],
               "--on-bad-record", "fail", "--out", str(out), "--runner", "beam", "--", *DIRECT]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"celerity prepare-data: error: {docs['folder']}/records.jsonl:31: not JSON")
    assert os.listdir(tmp_path / "new") == []


def test_an_empty_training_split_fails_in_the_pipeline_and_leaves_nothing(docs, tmp_path):
    cfg = DataConfig(source="text", paths=(f"{docs['folder']}/doc00.txt",), val_fraction=0.999999)
    with pytest.raises(ConfigError, match=r"is empty \(1 files, 0 train / 1 val documents\); every document fell "
                                          r"into the validation split: add files") as raised:
        beam.prepare_with_beam(cfg, str(tmp_path / "shards"), chunk_tokens=32, shard_tokens=300, beam_options=DIRECT)
    assert "while running" not in str(raised.value) and os.listdir(tmp_path) == []


def test_beam_refuses_a_stopped_run_and_options_without_the_beam_runner(docs, tmp_path, capsys):
    cfg = DataConfig(source="text", paths=(docs["folder"],))
    (tmp_path / ".shards.partial").mkdir()
    (tmp_path / ".shards.partial" / "progress.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"\.shards\.partial holds an unfinished prepare-data, which a Beam run "
                                          r"cannot resume; finish it with --runner local"):
        beam.prepare_with_beam(cfg, str(tmp_path / "shards"), chunk_tokens=32, shard_tokens=300, beam_options=DIRECT)
    assert os.listdir(tmp_path / ".shards.partial") == ["progress.json"]
    assert cli.main(["prepare-data", "--input", docs["folder"], "--out", str(tmp_path / "o"), "--", *DIRECT]) == 2
    assert "add --runner beam, or drop the options" in capsys.readouterr().err


def test_without_apache_beam_the_error_names_the_install(docs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "apache_beam", None)
    with pytest.raises(ConfigError, match=r"pip install 'celerity_jax\[beam\]' .* or use --runner local"):
        beam.prepare_with_beam(DataConfig(source="text", paths=(docs["folder"],)), str(tmp_path / "o"),
                               chunk_tokens=32, shard_tokens=300, beam_options=[])
