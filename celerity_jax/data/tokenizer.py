"""Tokenizers from local files only: bytes (the default), a HuggingFace tokenizer.json, a SentencePiece model.

Each has `name`, `vocab_size`, `separator_id` (the token appended after every document),
`special_tokens` (name -> id), `sha256` (of the file; "byte" for the byte tokenizer),
`encode_batch(texts)` returning one integer array per text, and `decode(ids)`.
"""

import functools
import hashlib
import os

import numpy as np

from celerity_jax.errors import ConfigError

# Tried in order when DataConfig.separator_token is empty.
END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")


class ByteTokenizer:
    """UTF-8 bytes are tokens 0..255; token 256 is the end-of-text separator."""

    name = "byte"
    sha256 = "byte"
    vocab_size = 257
    separator_id = 256
    special_tokens = {"<|endoftext|>": 256}

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]

    def decode(self, ids) -> str:
        ids = np.asarray(ids)
        cuts = np.flatnonzero(ids == self.separator_id)
        pieces = np.split(ids, cuts)
        # Every piece after the first starts with the separator itself.
        texts = [bytes(p[i > 0:].astype(np.uint8)).decode("utf-8", errors="replace") for i, p in enumerate(pieces)]
        return "<|endoftext|>".join(texts)


class HFTokenizer:
    """A HuggingFace `tokenizers` tokenizer.json; special tokens are not added around documents."""

    def __init__(self, path: str, separator_token: str):
        import tokenizers

        try:
            self._tok = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise ConfigError(f"DataConfig.tokenizer={path!r} is not a readable HuggingFace tokenizer.json "
                              f"({e}); give a tokenizer.json file, a SentencePiece .model file or 'byte'") from e
        self.name = path
        self.sha256 = file_sha256(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.separator_id = _find_separator(path, separator_token, self._tok.token_to_id)
        self.special_tokens = {t.content: int(i) for i, t in self._tok.get_added_tokens_decoder().items()
                               if t.special}

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, np.int32) for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


class SentencePieceTokenizer:
    """A SentencePiece .model file; no BOS/EOS are added inside documents."""

    def __init__(self, path: str, separator_token: str):
        import sentencepiece

        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as e:
            raise ConfigError(f"DataConfig.tokenizer={path!r} is not a readable SentencePiece model ({e}); "
                              "give a .model file written by SentencePiece training") from e
        self.name = path
        self.sha256 = file_sha256(path)
        self.vocab_size = self._sp.get_piece_size()
        self.special_tokens = {self._sp.id_to_piece(i): i for i in range(self.vocab_size)
                               if self._sp.is_control(i) or self._sp.is_unknown(i)}
        if self._sp.eos_id() >= 0 and not separator_token:
            self.separator_id = self._sp.eos_id()
        else:
            self.separator_id = _find_separator(path, separator_token, self._piece_id)

    def _piece_id(self, piece: str) -> int | None:
        token_id = self._sp.piece_to_id(piece)
        return None if token_id == self._sp.unk_id() and piece != self._sp.id_to_piece(token_id) else token_id

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, np.int32) for ids in self._sp.encode(texts, out_type=int)]

    def decode(self, ids) -> str:
        return self._sp.decode([int(i) for i in ids])


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _find_separator(path: str, separator_token: str, token_to_id) -> int:
    names = (separator_token,) if separator_token else END_OF_TEXT_TOKENS
    for name in names:
        token_id = token_to_id(name)
        if token_id is not None:
            return int(token_id)
    if separator_token:
        raise ConfigError(f"DataConfig.separator_token={separator_token!r} is not a token of {path}; "
                          "name one of its tokens (its end-of-text token is the usual choice)")
    raise ConfigError(f"the tokenizer {path} has none of the end-of-text tokens {END_OF_TEXT_TOKENS}; set "
                      "DataConfig.separator_token to the token placed "
                      "between documents")


@functools.lru_cache(maxsize=8)
def load_tokenizer(spec: str, separator_token: str = ""):
    """'byte', a path to a tokenizer.json (HuggingFace) or to a .model file (SentencePiece)."""
    if spec == "byte":
        if separator_token:
            raise ConfigError("DataConfig.separator_token is set, but the byte tokenizer has a fixed separator "
                              "(token 256); clear separator_token")
        return ByteTokenizer()
    if not os.path.isfile(spec):
        raise ConfigError(f"DataConfig.tokenizer={spec!r}: no such file; give 'byte', a local tokenizer.json "
                          "or a SentencePiece .model file (nothing is downloaded)")
    if spec.endswith(".json"):
        return HFTokenizer(spec, separator_token)
    if spec.endswith(".model"):
        return SentencePieceTokenizer(spec, separator_token)
    raise ConfigError(f"DataConfig.tokenizer={spec!r}: cannot tell the kind from the name; a HuggingFace "
                      "tokenizer ends in .json and a SentencePiece model in .model")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that stores every token id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def train_bpe(texts, vocab_size: int, path: str) -> str:
    """Trains a byte-level BPE tokenizer.json on local `texts` (separator `<|endoftext|>`); returns `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.save(path)
    return path
