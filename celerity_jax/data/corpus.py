"""Documents (standard library or user text), their train/validation split, and the packed token streams.

Packing: every document is followed by the tokenizer's separator and the documents are joined in a
fixed order (the paths as given, each folder or glob sorted; .jsonl lines in file order), so a split is
`doc_0 SEP doc_1 SEP ... doc_n SEP`. The split of a document is decided by a hash of its key (the path
below the standard library or as written by the user; `path:line` for .jsonl), so it is the same on every
machine and does not move when other files are added.

`load_corpus` keeps the packed streams in memory, once per process and corpus (the byte-tokenized
standard library takes well under a second). Files changed while a process runs are not re-read.
"""

import dataclasses
import functools
import glob
import hashlib
import json
import logging
import os
import sysconfig
from collections.abc import Iterator

import numpy as np

from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import load_tokenizer, token_dtype
from celerity_jax.errors import ConfigError

log = logging.getLogger(__name__)

# Folders of the standard library that hold test suites, third-party packages or bytecode.
STDLIB_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
TEXT_SUFFIXES = (".txt", ".jsonl")
_ENCODE_BATCH_DOCS = 256


@dataclasses.dataclass
class ReadReport:
    """What reading the documents found; `bad` lists skipped files and .jsonl lines with the reason."""

    files: int = 0
    documents: dict[str, int] = dataclasses.field(default_factory=lambda: {"train": 0, "val": 0})
    bad: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        text = f"{self.files} files, {self.documents['train']} train / {self.documents['val']} val documents"
        if self.bad:
            shown = "; ".join(self.bad[:3]) + ("; ..." if len(self.bad) > 3 else "")
            text += f", {len(self.bad)} skipped ({shown})"
        return text


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Packed token streams of both splits (uint16 or uint32) and what was read."""

    train: np.ndarray
    val: np.ndarray
    stats: dict


def stdlib_root() -> str:
    """The standard-library folder of the running interpreter (outside any virtualenv)."""
    return sysconfig.get_paths()["stdlib"]


def stdlib_files() -> list[tuple[str, str]]:
    """(key, path) of the standard library's .py files, tests and site-packages excluded, sorted by key."""
    root = stdlib_root()
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in STDLIB_EXCLUDED_DIRS)
        for name in sorted(files):
            # _sysconfigdata_* is generated at build time and differs from machine to machine.
            if name.endswith(".py") and not name.startswith("_sysconfigdata_"):
                path = os.path.join(folder, name)
                out.append((os.path.relpath(path, root), path))
    return sorted(out)


def expand_paths(patterns: tuple[str, ...], field: str) -> list[str]:
    """Files named by paths, globs (`**` recurses) and folders (their .txt/.jsonl files, recursively)."""
    out = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise ConfigError(f"DataConfig.{field}: the glob {pattern!r} matches no file; check the pattern "
                                  "(relative paths start at the working directory)")
        elif os.path.isdir(pattern):
            matches = sorted(os.path.join(folder, name) for folder, _, files in os.walk(pattern)
                             for name in files if name.endswith(TEXT_SUFFIXES))
            if not matches:
                raise ConfigError(f"DataConfig.{field}: the folder {pattern!r} holds no .txt or .jsonl file")
        elif os.path.isfile(pattern):
            matches = [pattern]
        else:
            raise ConfigError(f"DataConfig.{field}: {pattern!r} does not exist; give existing files, globs or "
                              "folders")
        out.extend(m for m in matches if m not in out)
    return out


def is_validation(key: str, val_fraction: float) -> bool:
    """The hash split: True for about `val_fraction` of all keys, the same on every machine."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return h < val_fraction * 2**64


def _read_text(path: str) -> tuple[str | None, str]:
    """The file's text, or None and why it is not text."""
    with open(path, "rb") as f:
        data = f.read()
    if b"\x00" in data:
        return None, "binary"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 at byte {e.start}"


def _bad(cfg: DataConfig, report: ReadReport, what: str) -> None:
    if cfg.on_bad_file == "fail":
        raise ConfigError(f"{what}; remove it from DataConfig.paths, or set DataConfig.on_bad_file='skip' "
                          "to skip such files with a count")
    report.bad.append(what)


def _file_documents(cfg: DataConfig, key: str, path: str, report: ReadReport) -> Iterator[tuple[str, str]]:
    """(key, text) of one file: the whole file, or each .jsonl line's `text_field` keyed `key:line`."""
    text, why = _read_text(path)
    report.files += 1
    if text is None:
        _bad(cfg, report, f"{path}: {why}")
        return
    if not path.endswith(".jsonl"):
        yield key, text
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            _bad(cfg, report, f"{path}:{lineno}: not JSON ({e.msg})")
            continue
        if not isinstance(record, dict) or not isinstance(record.get(cfg.text_field), str):
            _bad(cfg, report, f"{path}:{lineno}: no string field {cfg.text_field!r} (DataConfig.text_field)")
            continue
        yield f"{key}:{lineno}", record[cfg.text_field]


def iter_documents(cfg: DataConfig, report: ReadReport) -> Iterator[tuple[str, str]]:
    """(split, text) of every non-empty document, split "train" or "val", in the packing order."""
    if cfg.source == "stdlib":
        keyed = [(key, path, None) for key, path in stdlib_files()]
    elif cfg.source == "text":
        train_files = expand_paths(cfg.paths, "paths")
        val_files = expand_paths(cfg.val_paths, "val_paths")
        both = sorted(set(train_files) & set(val_files))
        if both:
            raise ConfigError(f"{both[0]} is in both DataConfig.paths and DataConfig.val_paths; a file belongs "
                              "to one split")
        fixed = "train" if val_files else None
        keyed = [(p, p, fixed) for p in train_files] + [(p, p, "val") for p in val_files]
    else:
        raise ConfigError(f"DataConfig.source={cfg.source!r} holds tokens, not documents")
    for file_key, path, split in keyed:
        for key, text in _file_documents(cfg, file_key, path, report):
            if not text:
                continue
            doc_split = split or ("val" if is_validation(key, cfg.val_fraction) else "train")
            report.documents[doc_split] += 1
            yield doc_split, text


def iter_tokenized(cfg: DataConfig, report: ReadReport) -> Iterator[tuple[str, np.ndarray]]:
    """(split, tokens of one document followed by the separator), in the packing order."""
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.separator_token)
    sep = np.array([tokenizer.separator_id], token_dtype(tokenizer.vocab_size))
    pending: list[tuple[str, str]] = []

    def flush():
        encoded = tokenizer.encode_batch([text for _, text in pending])
        for (split, _), ids in zip(pending, encoded):
            yield split, np.concatenate([ids.astype(sep.dtype, copy=False), sep])
        pending.clear()

    for split, text in iter_documents(cfg, report):
        pending.append((split, text))
        if len(pending) == _ENCODE_BATCH_DOCS:
            yield from flush()
    yield from flush()


def empty_corpus_error(cfg: DataConfig, report: ReadReport) -> ConfigError:
    where = "the standard library" if cfg.source == "stdlib" else f"DataConfig.paths={list(cfg.paths)}"
    hint = "give files with text"
    if any(".jsonl" in b for b in report.bad):
        hint = f"for .jsonl files check DataConfig.text_field={cfg.text_field!r}"
    elif report.documents["val"]:
        hint = "every document fell into the validation split: add files or name them in DataConfig.val_paths"
    return ConfigError(f"the training split of {where} is empty ({report.summary()}); {hint}")


@functools.lru_cache(maxsize=4)
def _load(cfg: DataConfig) -> Corpus:
    report = ReadReport()
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    for split, tokens in iter_tokenized(cfg, report):
        parts[split].append(tokens)
    if not parts["train"]:
        raise empty_corpus_error(cfg, report)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.separator_token)
    dtype = token_dtype(tokenizer.vocab_size)
    train, val = (np.concatenate(parts[s]) if parts[s] else np.zeros(0, dtype) for s in ("train", "val"))
    stats = {"source": cfg.source, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size,
             "train_tokens": int(train.size), "val_tokens": int(val.size), "files": report.files,
             "train_documents": report.documents["train"], "val_documents": report.documents["val"],
             "skipped": len(report.bad), "skipped_examples": report.bad[:10]}
    log.info("data: %s corpus, %s tokenizer: %s; %d train / %d val tokens", cfg.source, tokenizer.name,
             report.summary(), train.size, val.size)
    return Corpus(train, val, stats)


def load_corpus(cfg: DataConfig) -> Corpus:
    """The packed streams of a stdlib/text corpus, cached per process (order and seeds do not matter)."""
    return _load(dataclasses.replace(cfg, shuffle_seed=0, allow_repeat=True))
