import dataclasses
import json
import os
import pathlib
import shutil

import numpy as np
import pytest

from celerity_jax.data import arrayrecord, corpus, pipeline
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import load_tokenizer, train_bpe
from celerity_jax.errors import ConfigError

L, B = 16, 8


@pytest.fixture(scope="module")
def text_cfg(tmp_path_factory) -> DataConfig:
    root = tmp_path_factory.mktemp("text")
    for i in range(20):
        (root / f"doc{i:02d}.txt").write_text(f"document {i}: " + "spam and eggs " * (5 + 7 * i))
    return DataConfig(source="text", paths=(str(root),), val_fraction=0.3)


@pytest.fixture(scope="module")
def shards(text_cfg, tmp_path_factory) -> str:
    """Tiny records and shards, so windows straddle records and the stream spans several files."""
    out = str(tmp_path_factory.mktemp("shards") / "out")
    arrayrecord.prepare(text_cfg, out, chunk_tokens=50, shard_records=7)
    return out


def _broken_copy(shards: str, tmp_path, damage) -> str:
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    damage(copy)
    return str(copy)


def test_shards_hold_the_same_stream_as_memory(text_cfg, shards):
    with open(f"{shards}/meta.json") as f:
        meta = json.load(f)
    mem = corpus.load_corpus(text_cfg)
    assert meta["splits"]["train"]["tokens"] == mem.train.size and meta["splits"]["val"]["tokens"] == mem.val.size
    assert len(meta["splits"]["train"]["shards"]) > 2 and meta["vocab_size"] == 257 and meta["dtype"] == "uint16"
    stream = arrayrecord.ShardStream(shards, "train")
    starts = np.array([0, 49, 50, 333, mem.train.size - 120])
    np.testing.assert_array_equal(stream.windows(starts, 120), mem.train[starts[:, None] + np.arange(120)])


def test_shard_batches_equal_in_memory_batches(text_cfg, shards):
    shard_cfg = DataConfig(source="arrayrecord", paths=(shards,))
    assert pipeline.tokenizer_vocab_size(shard_cfg) == 257
    assert pipeline.corpus_stats(shard_cfg)["train_tokens"] == corpus.load_corpus(text_cfg).train.size
    a = pipeline.make_train_iterator(text_cfg, L, B, seed=2)
    b = pipeline.make_train_iterator(shard_cfg, L, B, seed=2)
    for _ in range(5):
        x, y = next(a), next(b)
        np.testing.assert_array_equal(x["inputs"], y["inputs"])
        np.testing.assert_array_equal(x["targets"], y["targets"])
    for x, y in zip(pipeline.make_eval_batches(text_cfg, L, B, 2), pipeline.make_eval_batches(shard_cfg, L, B, 2)):
        np.testing.assert_array_equal(x["inputs"], y["inputs"])


def test_bpe_shards_record_their_tokenizer(text_cfg, tmp_path):
    texts = [pathlib.Path(p).read_text() for p in corpus.expand_paths(text_cfg.paths, "paths")]
    tok = train_bpe(texts, 300, str(tmp_path / "tokenizer.json"))
    meta = arrayrecord.prepare(dataclasses.replace(text_cfg, tokenizer=tok), str(tmp_path / "bpe"))
    vocab = load_tokenizer(tok).vocab_size  # BPE training stops early once no pair repeats
    assert 257 < vocab <= 300 and meta["vocab_size"] == vocab and meta["tokenizer"] == tok
    assert meta["splits"]["train"]["tokens"] < corpus.load_corpus(text_cfg).train.size / 2
    assert pipeline.tokenizer_vocab_size(DataConfig(source="arrayrecord", paths=(str(tmp_path / "bpe"),))) == vocab


def test_prepare_never_writes_into_a_used_folder(text_cfg, shards):
    before = {p.name: p.read_bytes() for p in pathlib.Path(shards).iterdir()}
    with pytest.raises(ConfigError, match="not empty"):
        arrayrecord.prepare(text_cfg, shards)
    assert {p.name: p.read_bytes() for p in pathlib.Path(shards).iterdir()} == before


def test_a_folder_without_meta_is_not_a_dataset(tmp_path):
    with pytest.raises(ConfigError, match="meta.json does not exist.*prepare-data"):
        arrayrecord.read_meta(str(tmp_path))
    (tmp_path / "meta.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a celerity-tokens-v1"):
        arrayrecord.read_meta(str(tmp_path))


def test_a_truncated_shard_is_named(shards, tmp_path):
    def truncate(folder):
        path = folder / "train-00001.arrayrecord"
        path.write_bytes(path.read_bytes()[:1000])

    with pytest.raises(ConfigError, match="shard .*train-00001.arrayrecord is corrupt"):
        arrayrecord.ShardStream(_broken_copy(shards, tmp_path, truncate), "train")


def test_corrupt_bytes_in_a_shard_are_named_when_read(shards, tmp_path):
    def scribble(folder):
        path = folder / "train-00000.arrayrecord"
        data = bytearray(path.read_bytes())
        data[40:400] = b"x" * 360  # inside the records, before the footer the reader opens with
        path.write_bytes(bytes(data))

    stream = arrayrecord.ShardStream(_broken_copy(shards, tmp_path, scribble), "train")
    with pytest.raises(ConfigError, match="shard .*train-00000.arrayrecord is corrupt"):
        stream.windows(np.arange(0, 300, 50), 51)


def _all_in_validation(tmp_path) -> DataConfig:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "only.txt").write_text("the one document " * 20)
    return DataConfig(source="text", paths=(str(tmp_path / "docs"),), val_fraction=0.999999)


def test_a_failed_prepare_leaves_nothing_and_a_rerun_works(text_cfg, tmp_path):
    out = tmp_path / "new" / "shards"
    with pytest.raises(ConfigError, match="every document fell into the validation split"):
        arrayrecord.prepare(_all_in_validation(tmp_path), str(out))
    assert os.listdir(tmp_path / "new") == []  # neither --out nor the hidden partial folder
    assert arrayrecord.prepare(text_cfg, str(out))["splits"]["train"]["tokens"] > 0
    assert (out / "meta.json").exists() and os.listdir(tmp_path / "new") == ["shards"]


def test_an_interrupted_prepare_leaves_nothing(text_cfg, tmp_path, monkeypatch):
    def interrupt(*args):
        raise KeyboardInterrupt

    (tmp_path / "out").mkdir()
    monkeypatch.setattr(arrayrecord._SplitWriter, "close", interrupt)
    with pytest.raises(KeyboardInterrupt):
        arrayrecord.prepare(text_cfg, str(tmp_path / "out"))
    assert os.listdir(tmp_path) == ["out"] and os.listdir(tmp_path / "out") == []


def test_prepare_replaces_an_empty_folder_but_not_one_filled_meanwhile(text_cfg, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    arrayrecord.prepare(text_cfg, str(out))
    assert (out / "meta.json").exists()

    write_folder = arrayrecord._write_folder

    def someone_else_writes_too(*args):
        (tmp_path / "busy" / "theirs.txt").write_text("x")
        return write_folder(*args)

    (tmp_path / "busy").mkdir()
    monkeypatch.setattr(arrayrecord, "_write_folder", someone_else_writes_too)
    with pytest.raises(ConfigError, match="busy: the finished folder cannot be renamed to it"):
        arrayrecord.prepare(text_cfg, str(tmp_path / "busy"))
    assert os.listdir(tmp_path / "busy") == ["theirs.txt"] and sorted(os.listdir(tmp_path)) == ["busy", "out"]


@pytest.mark.parametrize("out, problem", [
    ("file", "--out {}/file is a file, not a folder"),
    ("file/sub", "{}/file is a file, not a folder, so no folder can be made under it"),
    (".", "--out . is the working directory"),
])
def test_prepare_refuses_outputs_it_cannot_make(text_cfg, tmp_path, monkeypatch, out, problem):
    (tmp_path / "file").write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=problem.format(tmp_path)):
        arrayrecord.prepare(text_cfg, out if out == "." else str(tmp_path / out))
    assert os.listdir(tmp_path) == ["file"]
