import json

import numpy as np
import pytest

from celerity_jax.data.tokenizer import ByteTokenizer, load_tokenizer, token_dtype, train_bpe
from celerity_jax.errors import ConfigError

TEXTS = [f"def f{i}(x):\n    return x * {i} + 'ü€'  # line {i}\n" for i in range(300)]


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory):
    return train_bpe(TEXTS, 400, str(tmp_path_factory.mktemp("bpe") / "tokenizer.json"))


def test_bytes_are_utf8_with_separator_256():
    tok = load_tokenizer("byte")
    ids = tok.encode_batch(["aü", ""])
    assert ids[0].tolist() == [97, 0xC3, 0xBC] and ids[1].size == 0
    assert (tok.vocab_size, tok.separator_id) == (257, 256)
    assert tok.decode(np.array([104, 105, 256, 0xC3, 0xBC])) == "hi<|endoftext|>ü"


def test_byte_tokenizer_has_no_configurable_separator():
    with pytest.raises(ConfigError, match="separator_token"):
        load_tokenizer("byte", "<|endoftext|>")


def test_bpe_trained_locally_round_trips_and_finds_its_end_of_text(bpe_path):
    tok = load_tokenizer(bpe_path)
    assert tok.vocab_size == 400
    with open(bpe_path) as f:
        assert tok.separator_id == json.load(f)["added_tokens"][0]["id"]
    ids = tok.encode_batch(TEXTS[:2])
    assert all(i.dtype == np.int32 for i in ids)
    assert sum(i.size for i in ids) < sum(len(t.encode()) for t in TEXTS[:2]) / 2  # merges were learned
    assert tok.decode(ids[1]) == TEXTS[1]
    assert tok.separator_id not in np.concatenate(ids)  # no special tokens are added inside documents


def test_bpe_separator_must_exist(bpe_path, tmp_path):
    with pytest.raises(ConfigError, match="separator_token='<nope>'"):
        load_tokenizer(bpe_path, "<nope>")
    with open(bpe_path) as f:
        spec = json.load(f)
    spec["added_tokens"] = []
    del spec["model"]["vocab"]["<|endoftext|>"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="end-of-text"):
        load_tokenizer(str(bare))


def test_sentencepiece_model_trained_locally(tmp_path):
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_prefix=str(tmp_path / "sp"),
                                             vocab_size=120, model_type="bpe", minloglevel=2)
    tok = load_tokenizer(str(tmp_path / "sp.model"))
    assert tok.vocab_size == 120 and tok.separator_id == 2  # SentencePiece's default </s>
    ids = tok.encode_batch(["return x * 7"])[0]
    assert tok.separator_id not in ids and tok.decode(ids) == "return x * 7"


def test_bad_tokenizer_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(ConfigError, match="cannot tell the kind"):
        load_tokenizer(str(tmp_path / "vocab.txt"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable HuggingFace"):
        load_tokenizer(str(tmp_path / "broken.json"))
    (tmp_path / "broken.model").write_bytes(b"\x00\x01garbage")
    with pytest.raises(ConfigError, match="not a readable SentencePiece"):
        load_tokenizer(str(tmp_path / "broken.model"))


def test_token_dtype_fits_the_vocab():
    assert token_dtype(ByteTokenizer.vocab_size) == np.uint16
    assert token_dtype(2**16) == np.uint16 and token_dtype(2**16 + 1) == np.uint32
