"""Pre-tokenized ArrayRecord shards: `celerity prepare-data` writes a folder, training reads it.

A folder holds
  meta.json                 format, tokenizer, vocab size, separator, dtype, chunk size, the shards of each split
  train-00000.arrayrecord   ...  consecutive chunks of `chunk_tokens` tokens of the packed train stream
  val-00000.arrayrecord     ...  (one record per chunk, little-endian `dtype`; a split's last chunk may be shorter)
The packed stream is the one `corpus` builds in memory (documents, each followed by the separator), so
both sources feed the pipeline the same tokens. meta.json is written last: a folder without it is
incomplete. The folder may be a gs:// path where the filesystem layers support it: meta.json is read
with etils.epath (gs:// needs `gcsfs`), the shards by ArrayRecord's own C++ file layer.
"""

import functools
import itertools
import json
import os
import shutil
import uuid

import numpy as np
from array_record.python import array_record_module
from etils import epath

from celerity_jax.data.config import DataConfig
from celerity_jax.data.corpus import ReadReport, empty_corpus_error, iter_tokenized
from celerity_jax.data.tokenizer import load_tokenizer, token_dtype
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_output_dir

FORMAT = "celerity-tokens-v1"
SPLITS = ("train", "val")


class _SplitWriter:
    """Cuts one split's stream into records of `chunk_tokens` tokens and shards of `shard_records` records."""

    def __init__(self, out: epath.Path, split: str, dtype: np.dtype, chunk_tokens: int, shard_records: int):
        self._out, self._split, self._dtype = out, split, dtype
        self._chunk, self._shard_records = chunk_tokens, shard_records
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0
        self._writer = None
        self.shards: list[dict] = []
        self.tokens = 0

    def add(self, tokens: np.ndarray) -> None:
        self._pending.append(tokens)
        self._pending_tokens += tokens.size
        self.tokens += tokens.size
        if self._pending_tokens >= self._chunk:
            stream = np.concatenate(self._pending)
            n_full = stream.size // self._chunk
            for i in range(n_full):
                self._write(stream[i * self._chunk:(i + 1) * self._chunk])
            self._pending = [stream[n_full * self._chunk:]]
            self._pending_tokens = self._pending[0].size

    def close(self) -> None:
        if self._pending_tokens:
            self._write(np.concatenate(self._pending))
        if self._writer is not None:
            self._writer.close()

    def _write(self, chunk: np.ndarray) -> None:
        if self._writer is None or self.shards[-1]["records"] == self._shard_records:
            if self._writer is not None:
                self._writer.close()
            name = f"{self._split}-{len(self.shards):05d}.arrayrecord"
            self._writer = array_record_module.ArrayRecordWriter(str(self._out / name), "group_size:1")
            self.shards.append({"file": name, "records": 0})
        self._writer.write(chunk.astype(self._dtype.newbyteorder("<")).tobytes())
        self.shards[-1]["records"] += 1


def prepare(cfg: DataConfig, out_dir: str, *, chunk_tokens: int = 4096, shard_records: int = 16384) -> dict:
    """Tokenizes the documents of `cfg` (source "stdlib" or "text") into a new shard folder; returns meta.

    A local `out_dir` (new, or an existing empty folder, which is replaced) appears complete or not at all:
    the shards are written into a hidden folder beside it, renamed to `out_dir` at the end and removed on any
    failure, Ctrl-C included. Missing parent folders are created. A URL (gs://...) is written in place, since
    object stores cannot rename a folder atomically: there, a failed run leaves shards without meta.json.
    """
    if chunk_tokens < 1 or shard_records < 1:
        raise ConfigError(f"--chunk-tokens={chunk_tokens} and --shard-records={shard_records} must be positive")
    url = "://" in out_dir
    if not url:
        _check_local_out(out_dir)
    out = epath.Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out_dir} is not empty; give a new or empty folder (nothing is overwritten)")
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.separator_token)
    report = ReadReport()
    documents = iter_tokenized(cfg, report)
    first = next(documents, None)  # bad paths and empty inputs fail here, before anything is created
    if first is None:
        raise empty_corpus_error(cfg, report)
    documents = itertools.chain([first], documents)
    if url:
        out.mkdir(parents=True, exist_ok=True)
        return _write_folder(cfg, tokenizer, documents, report, out, chunk_tokens, shard_records)
    target = os.path.realpath(out_dir)  # beside a symlink's target, so that the rename replaces the target
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    partial = os.path.join(parent, f".{name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(partial)  # not tempfile.mkdtemp, whose folder would keep mode 0o700 after the rename
    try:
        meta = _write_folder(cfg, tokenizer, documents, report, epath.Path(partial), chunk_tokens, shard_records)
        try:
            os.rename(partial, target)  # replaces an empty folder; refuses one that is no longer empty
        except OSError as e:
            raise ConfigError(f"--out {out_dir}: the finished folder cannot be renamed to it ({e.strerror}: was "
                              "something written there meanwhile?); give a new or empty folder") from e
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return meta


def _check_local_out(out_dir: str) -> None:
    check_output_dir(out_dir, "--out")
    target = os.path.realpath(out_dir)
    if target == os.path.realpath(os.getcwd()) or os.path.ismount(target):
        raise ConfigError(f"--out {out_dir} is the working directory or a mount point, which the finished folder "
                          f"cannot replace; give a folder inside it, e.g. --out {os.path.join(out_dir, 'shards')}")


def _write_folder(cfg: DataConfig, tokenizer, documents, report: ReadReport, out: epath.Path, chunk_tokens: int,
                  shard_records: int) -> dict:
    """Writes the shards of `documents` and then meta.json into the existing folder `out`; returns meta."""
    dtype = token_dtype(tokenizer.vocab_size)
    writers = {split: _SplitWriter(out, split, dtype, chunk_tokens, shard_records) for split in SPLITS}
    for split, tokens in documents:
        writers[split].add(tokens)
    for writer in writers.values():
        writer.close()
    if not writers["train"].tokens:
        raise empty_corpus_error(cfg, report)
    meta = {"format": FORMAT, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size,
            "separator_id": tokenizer.separator_id, "dtype": dtype.name, "chunk_tokens": chunk_tokens,
            "splits": {s: {"tokens": w.tokens, "shards": w.shards} for s, w in writers.items()},
            "source": {"source": cfg.source, "paths": list(cfg.paths), "val_paths": list(cfg.val_paths),
                       "val_fraction": cfg.val_fraction, "text_field": cfg.text_field,
                       "summary": report.summary(), "skipped": report.bad[:100]}}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


@functools.lru_cache(maxsize=8)
def read_meta(folder: str) -> dict:
    """The meta.json of a prepare-data folder, checked for the fields the reader needs."""
    path = epath.Path(folder) / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except ImportError as e:
        raise ConfigError(f"cannot read {path}: {e}; install gcsfs for gs:// paths, or mount the bucket "
                          "(gcsfuse) and give the local path in DataConfig.paths") from e
    except FileNotFoundError as e:
        raise ConfigError(f"{path} does not exist: DataConfig.paths={folder!r} is not a finished "
                          "`celerity prepare-data` folder; run prepare-data with --out there") from e
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path} ({e}); rerun `celerity prepare-data` into a new folder") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a {FORMAT} meta.json; rerun `celerity prepare-data` into a new folder")
    return meta


class ShardStream:
    """Random access to windows of one split's packed stream, read from its shards."""

    def __init__(self, folder: str, split: str):
        import grain  # imports jax (seconds), which prepare-data does not need

        meta = read_meta(folder)
        info = meta["splits"][split]
        self.n_tokens = int(info["tokens"])
        self._chunk = int(meta["chunk_tokens"])
        self._dtype = np.dtype(meta["dtype"]).newbyteorder("<")
        self._paths = [str(epath.Path(folder) / s["file"]) for s in info["shards"]]
        counts = [int(s["records"]) for s in info["shards"]]
        for path, count in zip(self._paths, counts):
            try:
                reader = array_record_module.ArrayRecordReader(path)
                found = reader.num_records()
                reader.close()
            except (OSError, RuntimeError, ValueError) as e:
                raise _corrupt(path, str(e)) from e
            if found != count:
                raise _corrupt(path, f"{found} records where meta.json lists {count}")
        self._ends = np.cumsum(counts)
        self._source = (grain.sources.ArrayRecordDataSource([f"{p}[0:{n}]" for p, n in zip(self._paths, counts)])
                        if self._paths else None)

    def _records(self, ids: list[int]) -> list[np.ndarray]:
        try:
            raw = self._source.__getitems__(ids)
        except (OSError, RuntimeError, ValueError) as e:
            raise self._locate_failure(ids, e) from e
        n_records = int(self._ends[-1])
        out = []
        for i, data in zip(ids, raw):
            expected = self._chunk if i < n_records - 1 else self.n_tokens - self._chunk * (n_records - 1)
            if len(data) != expected * self._dtype.itemsize:
                raise _corrupt(self._shard_of(i), f"record {i} holds {len(data)} bytes, expected "
                                                  f"{expected * self._dtype.itemsize}")
            out.append(np.frombuffer(data, self._dtype))
        return out

    def _shard_of(self, record: int) -> str:
        return self._paths[int(np.searchsorted(self._ends, record, side="right"))]

    def _locate_failure(self, ids: list[int], error: Exception) -> ConfigError:
        for i in ids:
            try:
                self._source[i]
            except (OSError, RuntimeError, ValueError) as e:
                return _corrupt(self._shard_of(i), f"record {i}: {e}")
        return ConfigError(f"reading the shards {self._paths[0]}, ... failed ({error}) although every record "
                           "reads alone; the filesystem may be flaky: resume the run from its checkpoint")

    def windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """int32[len(starts), width]: the stream's tokens [s, s + width) for each start s."""
        first = starts // self._chunk
        last = (starts + width - 1) // self._chunk
        ids = sorted({int(r) for a, b in zip(first, last) for r in range(a, b + 1)})
        records = dict(zip(ids, self._records(ids)))
        out = np.empty((len(starts), width), np.int32)
        for row, (s, a, b) in enumerate(zip(starts, first, last)):
            span = np.concatenate([records[r] for r in range(a, b + 1)])
            offset = s - a * self._chunk
            out[row] = span[offset:offset + width]
        return out


def _corrupt(path: str, why: str) -> ConfigError:
    return ConfigError(f"the ArrayRecord shard {path} is corrupt ({why}); rerun `celerity prepare-data` "
                       "into a new folder, or restore the shard from a copy")
