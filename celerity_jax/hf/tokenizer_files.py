"""The run's tokenizer as Hugging Face files, and back.

- byte tokenizer: a `tokenizers` tokenizer.json that encodes exactly as ours (tested on ASCII, non-ASCII, control
  bytes): GPT-2's byte-to-character map with the character of byte b at id b, no merges, no regex split, and
  `<|endoftext|>` = 256. tokenizer_config.json sets split_special_tokens, so that transformers encodes that text
  as its bytes, as ours does;
- a HuggingFace tokenizer.json: copied, with a tokenizer_config.json naming its end-of-text token;
- a SentencePiece .model: copied as tokenizer.model (no transformers tokenizer class is claimed for it).
"""

import json
import os
import shutil

from celerity_jax.data.tokenizer import ByteTokenizer, HFTokenizer, SentencePieceTokenizer
from celerity_jax.errors import ConfigError

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SENTENCEPIECE_MODEL = "tokenizer.model"


def _byte_characters() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable character standing for each byte 0..255, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = dict(zip(printable, map(chr, printable)))
    chars.update({b: chr(256 + n) for n, b in enumerate(others)})
    return [chars[b] for b in range(256)]


def byte_tokenizer():
    """A `tokenizers.Tokenizer` equal to ByteTokenizer: byte b is id b, `<|endoftext|>` is 256."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: b for b, char in enumerate(_byte_characters())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(ByteTokenizer().decode([ByteTokenizer.separator_id]), special=True,
                                       normalized=False)])
    return tok


def kind(tokenizer) -> str:
    """"byte", "tokenizer.json" or "sentencepiece"."""
    if isinstance(tokenizer, ByteTokenizer):
        return "byte"
    if isinstance(tokenizer, HFTokenizer):
        return "tokenizer.json"
    if isinstance(tokenizer, SentencePieceTokenizer):
        return "sentencepiece"
    raise ConfigError(f"the tokenizer {tokenizer.name} is of no kind the Hugging Face export knows; train with 'byte', "
                      "a tokenizer.json or a SentencePiece .model")


def write(tokenizer, out_dir: str) -> str:
    """Writes the tokenizer files into `out_dir`; returns a line for the model card saying what was written."""
    eos = tokenizer.decode([tokenizer.separator_id])
    what = kind(tokenizer)
    if what == "sentencepiece":
        shutil.copyfile(tokenizer.name, os.path.join(out_dir, SENTENCEPIECE_MODEL))
        return (f"`{SENTENCEPIECE_MODEL}` is the run's SentencePiece model, copied (end of text: id "
                f"{tokenizer.separator_id}); load it with `sentencepiece`: no transformers tokenizer class is claimed "
                "to encode as it does")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "clean_up_tokenization_spaces": False}
    if what == "byte":
        byte_tokenizer().save(os.path.join(out_dir, TOKENIZER_JSON))
        # one token separates documents in training: it also starts them, and pads
        config.update(bos_token=eos, pad_token=eos, split_special_tokens=True)
        note = (f"`{TOKENIZER_JSON}` reproduces the run's byte tokenizer (UTF-8 bytes are ids 0..255, `{eos}` is 256; "
                "verified to encode and decode as it does, non-ASCII text included)")
    else:
        shutil.copyfile(tokenizer.name, os.path.join(out_dir, TOKENIZER_JSON))
        note = f"`{TOKENIZER_JSON}` is the run's tokenizer, copied (end of text: `{eos}`, id {tokenizer.separator_id})"
    with open(os.path.join(out_dir, TOKENIZER_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    return note


def eos_token(folder: str) -> str:
    """The eos_token named by the folder's tokenizer_config.json ("" when it names none)."""
    path = os.path.join(folder, TOKENIZER_CONFIG)
    if not os.path.isfile(path):
        return ""
    try:
        with open(path) as f:
            eos = json.load(f).get("eos_token") or ""
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not readable JSON ({e}); fix or remove it") from None
    return eos.get("content", "") if isinstance(eos, dict) else str(eos)
