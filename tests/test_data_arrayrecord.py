import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest

from celerity_jax.data import arrayrecord, corpus, pipeline, prepare, sources
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import file_sha256, load_tokenizer, train_bpe
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
    """Tiny records, tasks and shards, so windows straddle records and shards (whose last records are short)."""
    out = str(tmp_path_factory.mktemp("shards") / "out")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(corpus, "TASK_BYTES", 200)
        prepare.prepare(text_cfg, out, chunk_tokens=50, shard_tokens=300)
    return out


def _broken_copy(shards: str, tmp_path, damage) -> str:
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    damage(copy)
    return str(copy)


def test_shards_hold_the_same_stream_as_memory(text_cfg, shards):
    with open(f"{shards}/manifest.json") as f:
        manifest = json.load(f)
    mem = corpus.load_corpus(text_cfg)
    train = manifest["splits"]["train"]
    assert train["tokens"] == mem.train.size and manifest["splits"]["val"]["tokens"] == mem.val.size
    assert len(train["shards"]) > 2 and manifest["tokenizer"]["vocab_size"] == 257 and manifest["dtype"] == "uint16"
    assert sum(s["tokens"] for s in train["shards"]) == train["tokens"]
    assert any(s["tokens"] % 50 for s in train["shards"][:-1])  # a short record inside the stream
    stream = arrayrecord.ShardStream(shards, "train")
    ends = np.cumsum([s["tokens"] for s in train["shards"]])
    starts = np.array([0, 49, 50, 333, ends[0] - 1, ends[1] - 60, mem.train.size - 120])
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


def test_bpe_shards_record_their_tokenizer_and_training_checks_it(text_cfg, tmp_path):
    texts = [pathlib.Path(p).read_text() for p in sources.expand_paths(text_cfg.paths, "paths")]
    tok = train_bpe(texts, 300, str(tmp_path / "tokenizer.json"))
    manifest = prepare.prepare(dataclasses.replace(text_cfg, tokenizer=tok), str(tmp_path / "bpe"))
    vocab = load_tokenizer(tok).vocab_size  # BPE training stops early once no pair repeats
    assert 257 < vocab <= 300 and manifest["tokenizer"] == {
        "name": tok, "sha256": file_sha256(tok), "vocab_size": vocab, "separator_id": 0,
        "special_tokens": {"<|endoftext|>": 0}}
    assert manifest["splits"]["train"]["tokens"] < corpus.load_corpus(text_cfg).train.size / 2
    shard_cfg = DataConfig(source="arrayrecord", paths=(str(tmp_path / "bpe"),), tokenizer=tok)
    assert pipeline.tokenizer_vocab_size(shard_cfg) == vocab
    with pytest.raises(ConfigError, match="made with the tokenizer .*tokenizer.json .*DataConfig.tokenizer='byte' is "
                                          "sha256 byte, 257 tokens"):
        pipeline.make_train_iterator(dataclasses.replace(shard_cfg, tokenizer="byte"), L, B, seed=0)


def test_prepare_never_writes_into_a_used_folder(text_cfg, shards):
    before = {p.name: p.read_bytes() for p in pathlib.Path(shards).iterdir()}
    with pytest.raises(ConfigError, match="not empty"):
        prepare.prepare(text_cfg, shards)
    assert {p.name: p.read_bytes() for p in pathlib.Path(shards).iterdir()} == before


def test_a_folder_without_a_manifest_is_not_a_dataset(tmp_path):
    with pytest.raises(ConfigError, match="manifest.json does not exist.*is not a finished `celerity prepare-data`"):
        arrayrecord.read_manifest(str(tmp_path))
    (tmp_path / "meta.json").write_text("{}")
    arrayrecord.read_manifest.cache_clear()
    with pytest.raises(ConfigError, match="was written by an older prepare-data; run prepare-data"):
        arrayrecord.read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{}")
    arrayrecord.read_manifest.cache_clear()
    with pytest.raises(ConfigError, match="not a celerity-tokens-v2 manifest"):
        arrayrecord.read_manifest(str(tmp_path))


def test_a_truncated_shard_is_named(shards, tmp_path):
    second = arrayrecord.read_manifest(shards)["splits"]["train"]["shards"][1]["file"]

    def truncate(folder):
        path = folder / second
        path.write_bytes(path.read_bytes()[:1000])

    with pytest.raises(ConfigError, match=f"shard .*{second} is corrupt"):
        arrayrecord.ShardStream(_broken_copy(shards, tmp_path, truncate), "train")


def test_corrupt_bytes_in_a_shard_are_named_when_read(shards, tmp_path):
    first = arrayrecord.read_manifest(shards)["splits"]["train"]["shards"][0]

    def scribble(folder):
        path = folder / first["file"]
        data = bytearray(path.read_bytes())
        data[40:160] = b"x" * 120  # inside the first records, before the footer the reader opens with (a shard of
        # 300 tokens holds a few hundred bytes of records, then its footer, padded to 128 KiB)
        path.write_bytes(bytes(data))

    stream = arrayrecord.ShardStream(_broken_copy(shards, tmp_path, scribble), "train")
    with pytest.raises(ConfigError, match=f"shard .*{first['file']} is corrupt"):
        stream.windows(np.arange(0, first["tokens"] - 51, 50), 51)
