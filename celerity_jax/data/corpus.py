"""Documents (standard library or user files), their train/validation split, and the packed token streams.

Packing: every document is followed by the tokenizer's separator and the documents are joined in a
fixed order (the paths as given, each folder or glob sorted; records in file order), so a split is
`doc_0 SEP doc_1 SEP ... doc_n SEP`. The split of a document is decided by a hash of its key (a whole
file: its path below the standard library or as written by the user; a .jsonl line: `path:line`; a
Parquet row: `path:row`), so it is the same on every machine and does not move when files are added.

The work is cut into tasks: consecutive pieces of input (whole files, Parquet row groups) of at least
TASK_BYTES, or one large piece each. A task is tokenized as a unit, in this process or in a worker
(`prepare`), and its result depends on nothing else, so the packed streams are the concatenation of the
task results in task order, whatever ran them.

`load_corpus` keeps the packed streams in memory, once per process and corpus (the byte-tokenized
standard library takes well under a second). Files changed while a process runs are not re-read.
"""

import dataclasses
import functools
import hashlib
import logging
import os
import sysconfig

import numpy as np

from celerity_jax.data import sources
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import load_tokenizer, token_dtype
from celerity_jax.errors import ConfigError

log = logging.getLogger(__name__)

# Folders of the standard library that hold test suites, third-party packages or bytecode.
STDLIB_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
SPLITS = ("train", "val")
TASK_BYTES = 1 << 20
ENCODE_BATCH_DOCS = 256


@dataclasses.dataclass(frozen=True)
class InputFile:
    path: str
    key: str
    split: str | None  # "train" or "val" when the user named the split's files, else None: the hash split


@dataclasses.dataclass(frozen=True)
class Task:
    """Consecutive pieces of input of one fixed split (or of the hash split), tokenized as a unit."""

    index: int
    split: str | None
    pieces: tuple[sources.Piece, ...]

    @property
    def n_bytes(self) -> int:
        return sum(p.n_bytes for p in self.pieces)

    @property
    def n_files(self) -> int:
        """Files that start in this task (a Parquet file's pieces may span tasks)."""
        return sum(p.row_group <= 0 for p in self.pieces)


@dataclasses.dataclass
class TaskResult:
    """The packed tokens of one task's documents, per split, and what was read."""

    index: int
    tokens: dict[str, np.ndarray]
    documents: dict[str, int]
    bad: sources.BadRecords
    n_bytes: int
    n_files: int

    @property
    def n_tokens(self) -> int:
        return sum(t.size for t in self.tokens.values())


@dataclasses.dataclass
class ReadReport:
    """What reading found, summed over tasks: files, documents and tokens per split, malformed records."""

    files: int = 0
    documents: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    tokens: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    bad: sources.BadRecords = dataclasses.field(default_factory=sources.BadRecords)

    def add(self, result: TaskResult) -> None:
        self.merge(ReadReport(result.n_files, dict(result.documents),
                              {s: int(result.tokens[s].size) for s in SPLITS}, result.bad))

    def merge(self, other: "ReadReport") -> None:
        """Adds a later part's counts; the skipped-record examples stay the first ones, in order."""
        self.files += other.files
        for split in SPLITS:
            self.documents[split] += other.documents[split]
            self.tokens[split] += other.tokens[split]
        self.bad.merge(other.bad)

    def summary(self) -> str:
        text = f"{self.files} files, {self.documents['train']} train / {self.documents['val']} val documents"
        if self.bad.count:
            shown = "; ".join(self.bad.examples[:3]) + ("; ..." if self.bad.count > 3 else "")
            text += f", {self.bad.count} skipped ({shown})"
        return text

    def to_json(self) -> dict:
        return {"files": self.files, "documents": self.documents, "tokens": self.tokens,
                "skipped": self.bad.count, "skipped_examples": self.bad.examples}

    @classmethod
    def from_json(cls, data: dict) -> "ReadReport":
        return cls(data["files"], dict(data["documents"]), dict(data["tokens"]),
                   sources.BadRecords(data["skipped"], list(data["skipped_examples"])))


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


def input_files(cfg: DataConfig) -> list[InputFile]:
    """Every input file of a stdlib/text corpus, in the packing order; ConfigError for bad paths."""
    if cfg.source == "stdlib":
        return [InputFile(path, key, None) for key, path in stdlib_files()]
    if cfg.source != "text":
        raise ConfigError(f"DataConfig.source={cfg.source!r} holds tokens, not documents")
    train_files = sources.expand_paths(cfg.paths, "paths")
    val_files = sources.expand_paths(cfg.val_paths, "val_paths")
    both = sorted(set(train_files) & set(val_files))
    if both:
        raise ConfigError(f"{both[0]} is in both DataConfig.paths and DataConfig.val_paths; a file belongs to one "
                          "split")
    fixed = "train" if val_files else None
    return [InputFile(p, p, fixed) for p in train_files] + [InputFile(p, p, "val") for p in val_files]


def plan_tasks(files: list[InputFile]) -> list[Task]:
    """The files' pieces cut into tasks of at least TASK_BYTES; a task never mixes fixed splits."""
    tasks: list[Task] = []
    pending: list[sources.Piece] = []
    pending_split, pending_bytes = None, 0

    def close():
        nonlocal pending_bytes
        tasks.append(Task(len(tasks), pending_split, tuple(pending)))
        pending.clear()
        pending_bytes = 0

    for f in files:
        for piece in sources.file_pieces(f.path, f.key):
            if pending and f.split != pending_split:
                close()
            pending.append(piece)
            pending_split, pending_bytes = f.split, pending_bytes + piece.n_bytes
            if pending_bytes >= TASK_BYTES:
                close()
    if pending:
        close()
    return tasks


def is_validation(key: str, val_fraction: float) -> bool:
    """The hash split: True for about `val_fraction` of all keys, the same on every machine."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return h < val_fraction * 2**64


def tokenize_task(cfg: DataConfig, task: Task) -> TaskResult:
    """Reads, splits and tokenizes one task's documents; ConfigError on a bad record with on_bad_record='fail'."""
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.separator_token)
    dtype = token_dtype(tokenizer.vocab_size)
    separator = np.array([tokenizer.separator_id], dtype)
    bad = sources.BadRecords()
    texts: dict[str, list[str]] = {split: [] for split in SPLITS}
    for piece in task.pieces:
        for key, text in sources.read_piece(piece, cfg.text_column, cfg.on_bad_record, bad):
            if text:
                texts[task.split or ("val" if is_validation(key, cfg.val_fraction) else "train")].append(text)
    tokens = {}
    for split, docs in texts.items():
        parts = []
        for start in range(0, len(docs), ENCODE_BATCH_DOCS):
            for ids in tokenizer.encode_batch(docs[start:start + ENCODE_BATCH_DOCS]):
                parts += [ids.astype(dtype, copy=False), separator]
        tokens[split] = np.concatenate(parts) if parts else np.zeros(0, dtype)
    return TaskResult(task.index, tokens, {s: len(d) for s, d in texts.items()}, bad, task.n_bytes, task.n_files)


def empty_corpus_error(cfg: DataConfig, report: ReadReport) -> ConfigError:
    where = "the standard library" if cfg.source == "stdlib" else f"DataConfig.paths={list(cfg.paths)}"
    hint = "give files with text"
    if any("DataConfig.text_column" in b for b in report.bad.examples):
        hint = f"check the text column (DataConfig.text_column={cfg.text_column!r})"
    elif report.documents["val"]:
        hint = "every document fell into the validation split: add files or name them in DataConfig.val_paths"
    return ConfigError(f"the training split of {where} is empty ({report.summary()}); {hint}")


@functools.lru_cache(maxsize=4)
def _load(cfg: DataConfig) -> Corpus:
    report = ReadReport()
    parts: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
    for task in plan_tasks(input_files(cfg)):
        result = tokenize_task(cfg, task)
        report.add(result)
        for split in SPLITS:
            parts[split].append(result.tokens[split])
    if not report.tokens["train"]:
        raise empty_corpus_error(cfg, report)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.separator_token)
    train, val = (np.concatenate(parts[s]) for s in SPLITS)
    stats = {"source": cfg.source, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size,
             "train_tokens": int(train.size), "val_tokens": int(val.size), "files": report.files,
             "train_documents": report.documents["train"], "val_documents": report.documents["val"],
             "skipped": report.bad.count, "skipped_examples": report.bad.examples}
    log.info("data: %s corpus, %s tokenizer: %s; %d train / %d val tokens", cfg.source, tokenizer.name,
             report.summary(), train.size, val.size)
    return Corpus(train, val, stats)


def load_corpus(cfg: DataConfig) -> Corpus:
    """The packed streams of a stdlib/text corpus, cached per process (order, seeds and workers do not matter)."""
    return _load(dataclasses.replace(cfg, shuffle_seed=0, allow_repeat=True, read_workers=0))
