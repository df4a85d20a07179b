"""The byte tokenizer's tokenizer.json encodes and decodes as ByteTokenizer, through `tokenizers` and transformers."""

import random

import pytest

from celerity_jax.data.tokenizer import ByteTokenizer
from celerity_jax.hf import tokenizer_files

TEXTS = ["def f(x):\n\treturn x  # ünïcode ☃ 😀 日本語", " leading space", "a\r\nb\x00\x01\x7f", "",
         "a literal <|endoftext|> in the text"]


def _random_texts(n: int) -> list[str]:
    rng = random.Random(0)
    return ["".join(chr(rng.randrange(1, 0x3000)) for _ in range(40)) for _ in range(n)]


def test_tokenizers_encodes_and_decodes_as_bytes():
    ours, theirs = ByteTokenizer(), tokenizer_files.byte_tokenizer()
    for text in TEXTS[:-1] + _random_texts(100):
        ids = [int(i) for i in ours.encode_batch([text])[0]]
        assert theirs.encode(text, add_special_tokens=False).ids == ids
        assert theirs.decode(ids + [256] + ids, skip_special_tokens=False) == ours.decode(ids + [256] + ids)
    broken = [0xC3, 65]  # a UTF-8 sequence cut short
    assert theirs.decode(broken) == ours.decode(broken)


def test_transformers_encodes_the_separator_text_as_bytes(tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizer_files.write(ByteTokenizer(), str(tmp_path))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert tokenizer.eos_token_id == tokenizer.bos_token_id == tokenizer.pad_token_id == 256
    ours = ByteTokenizer()
    for text in TEXTS:
        assert tokenizer(text, add_special_tokens=False).input_ids == [int(i) for i in ours.encode_batch([text])[0]]
    assert tokenizer.decode([104, 105, 256]) == ours.decode([104, 105, 256])
