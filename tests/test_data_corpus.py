import json
import os

import numpy as np
import pytest

from celerity_jax.data import corpus
from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError

SEP = 256


def _text_cfg(*paths, **kwargs) -> DataConfig:
    return DataConfig(source="text", paths=tuple(str(p) for p in paths), **kwargs)


def test_stdlib_files_exclude_tests_and_site_packages():
    files = corpus.stdlib_files()
    keys = [k for k, _ in files]
    assert len(files) > 300 and keys == sorted(keys)
    assert "argparse.py" in keys and os.path.join("json", "decoder.py") in keys
    for key, path in files:
        parts = key.split(os.sep)
        assert key.endswith(".py") and path.startswith(corpus.stdlib_root())
        assert not set(parts[:-1]) & corpus.STDLIB_EXCLUDED_DIRS, key
    assert not any(k.startswith("_sysconfigdata_") for k in keys)


def test_stdlib_corpus_counts_every_byte_and_separator():
    c = corpus.load_corpus(DataConfig())
    files = corpus.stdlib_files()
    n_bytes = sum(os.path.getsize(p) for _, p in files)
    n_docs = sum(1 for _, p in files if os.path.getsize(p))
    assert c.stats["train_tokens"] + c.stats["val_tokens"] == n_bytes + n_docs
    assert c.stats["train_documents"] + c.stats["val_documents"] == n_docs
    assert c.stats["train_tokens"] > 5_000_000 and c.stats["val_tokens"] > 100_000
    assert c.train.dtype == np.uint16 and c.train[-1] == SEP
    assert corpus.load_corpus(DataConfig(shuffle_seed=3, allow_repeat=False)) is c  # cached per process


def test_hash_split_is_deterministic_and_near_the_fraction():
    keys = [f"pkg/module_{i}.py" for i in range(4000)]
    val = [k for k in keys if corpus.is_validation(k, 0.1)]
    assert 300 < len(val) < 500
    assert val == [k for k in keys if corpus.is_validation(k, 0.1)]
    assert set(val) <= {k for k in keys if corpus.is_validation(k, 0.2)}  # growing the fraction only adds


def test_text_and_jsonl_documents_are_packed_with_separators(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "wörld"}) + "\n\n" + json.dumps({"body": "x"}) + "\n")
    (tmp_path / "v.txt").write_text("held out")
    c = corpus.load_corpus(_text_cfg(tmp_path / "a.txt", tmp_path / "b.jsonl", val_paths=(str(tmp_path / "v.txt"),),
                                     text_column="body"))
    expected = list(b"hello") + [SEP] + list("wörld".encode()) + [SEP] + list(b"x") + [SEP]
    assert c.train.tolist() == expected
    assert c.val.tolist() == list(b"held out") + [SEP]
    assert (c.stats["files"], c.stats["train_documents"], c.stats["skipped"]) == (3, 3, 0)


@pytest.mark.parametrize("make, pattern, match", [
    (False, "missing.txt", "DataConfig.paths: .*missing.txt.* does not exist"),
    (False, "*.nothing", "matches no file"),
    (True, "empty_dir", "holds no .txt, .jsonl"),
])
def test_missing_paths_name_the_path(tmp_path, make, pattern, match):
    if make:
        (tmp_path / pattern).mkdir()
    with pytest.raises(ConfigError, match=match):
        corpus.load_corpus(_text_cfg(tmp_path / pattern))


def test_a_file_in_both_splits_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(ConfigError, match="both DataConfig.paths and DataConfig.val_paths"):
        corpus.load_corpus(_text_cfg(tmp_path / "a.txt", val_paths=(str(tmp_path / "a.txt"),)))


def test_binary_and_undecodable_files_are_skipped_with_a_count_or_fail(tmp_path):
    (tmp_path / "good.txt").write_text("fine text")
    (tmp_path / "bin.txt").write_bytes(b"\x7fELF\x00\x00\x01")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    cfg = _text_cfg(tmp_path, val_fraction=0.01)
    c = corpus.load_corpus(cfg)
    assert c.stats["skipped"] == 2 and c.stats["files"] == 3
    assert any("bin.txt: binary" in s for s in c.stats["skipped_examples"])
    assert any("latin1.txt: not UTF-8 at byte 3" in s for s in c.stats["skipped_examples"])
    with pytest.raises(ConfigError, match="bin.txt: binary.*DataConfig.on_bad_record = 'skip'"):
        corpus.load_corpus(_text_cfg(tmp_path, on_bad_record="fail"))


def test_bad_jsonl_lines_are_counted_and_a_wrong_field_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\nnot json\n{"content": "x"}\n[1]\n')
    c = corpus.load_corpus(_text_cfg(path, val_fraction=0.01))
    assert c.stats["skipped"] == 3 and c.train.tolist() == list(b"ok") + [SEP]
    with pytest.raises(ConfigError, match=r"d.jsonl:2: not JSON"):
        corpus.load_corpus(_text_cfg(path, on_bad_record="fail"))
    with pytest.raises(ConfigError, match=r"is empty.*; check the text column \(DataConfig.text_column='body'"):
        corpus.load_corpus(_text_cfg(path, text_column="body"))


def test_an_empty_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ConfigError, match="training split of DataConfig.paths=.*is empty"):
        corpus.load_corpus(_text_cfg(tmp_path / "empty.txt"))


def test_a_corpus_hashed_entirely_into_validation_says_so(tmp_path):
    path = tmp_path / "only.txt"
    path.write_text("some text")
    assert corpus.is_validation(str(path), 0.999999)
    with pytest.raises(ConfigError, match="fell into the validation split.*DataConfig.val_paths"):
        corpus.load_corpus(_text_cfg(path, val_fraction=0.999999))
