"""Pre-tokenized ArrayRecord shards: the folder `celerity prepare-data` writes and training reads.

A folder holds
  manifest.json             format, tokenizer identity, dtype, chunk size, settings, sources, counts, shards
  train-00000.arrayrecord   ...  one shard per split and shard group (a run of consecutive tasks, see
  val-00000.arrayrecord     ...  `prepare`): records of `chunk_tokens` tokens of the packed stream, the
                                 shard's last record shorter; little-endian `dtype`
A split's packed stream is its shards' records in manifest order: the stream `corpus` builds in memory
(documents, each followed by the separator), so both sources feed the pipeline the same tokens. A group
without tokens of a split has no shard of that split. manifest.json is written last: a folder without it
is incomplete. The folder may be a gs:// path where the filesystem layers support it: manifest.json is
read with etils.epath (gs:// needs `gcsfs`), the shards by ArrayRecord's own C++ file layer.
"""

import functools
import json
import pathlib

import numpy as np
from array_record.python import array_record_module
from etils import epath

from celerity_jax.data.config import DataConfig
from celerity_jax.data.corpus import SPLITS
from celerity_jax.data.tokenizer import load_tokenizer
from celerity_jax.errors import ConfigError, RunStopped

FORMAT = "celerity-tokens-v2"
MANIFEST = "manifest.json"


def tokenizer_identity(tokenizer) -> dict:
    return {"name": tokenizer.name, "sha256": tokenizer.sha256, "vocab_size": tokenizer.vocab_size,
            "separator_id": tokenizer.separator_id, "special_tokens": tokenizer.special_tokens}


def write_group(folder: pathlib.Path, group: int, tokens: dict[str, list[np.ndarray]], dtype: np.dtype,
                chunk_tokens: int) -> dict[str, dict]:
    """Writes each split's tokens of shard group `group` as one shard into the local `folder`; returns
    {split: shard entry}."""
    shards = {}
    for split in SPLITS:
        stream = np.concatenate(tokens[split]).astype(np.dtype(dtype).newbyteorder("<"), copy=False)
        if not stream.size:
            continue
        name = f"{split}-{group:05d}.arrayrecord"
        try:
            writer = array_record_module.ArrayRecordWriter(str(folder / name), "group_size:1")
            for start in range(0, stream.size, chunk_tokens):
                writer.write(stream[start:start + chunk_tokens].tobytes())
            writer.close()
        except RuntimeError as e:  # ArrayRecord reports its file errors (a full disk, say) as RuntimeError
            raise RunStopped(f"writing the shard {folder / name} failed ({e}); fix the disk or folder, then rerun "
                             "the same command to resume") from e
        shards[split] = {"file": name, "records": -(-stream.size // chunk_tokens), "tokens": int(stream.size)}
    return shards


@functools.lru_cache(maxsize=8)
def read_manifest(folder: str) -> dict:
    """The manifest.json of a prepare-data folder, checked for the format the reader needs."""
    path = epath.Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except ImportError as e:
        raise ConfigError(f"cannot read {path}: {e}; install gcsfs for gs:// paths, or mount the bucket "
                          "(gcsfuse) and give the local path in DataConfig.paths") from e
    except FileNotFoundError as e:
        older = (epath.Path(folder) / "meta.json").exists()
        what = "was written by an older prepare-data" if older else "is not a finished `celerity prepare-data` folder"
        raise ConfigError(f"{path} does not exist: DataConfig.paths={folder!r} {what}; run prepare-data with --out "
                          "there (a new folder)") from e
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path} ({e}); rerun `celerity prepare-data` into a new folder") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a {FORMAT} manifest; rerun `celerity prepare-data` into a new folder")
    return manifest


def checked_manifest(cfg: DataConfig) -> dict:
    """The manifest of the run's shard folder, after checking that the run names the shards' tokenizer."""
    folder = cfg.paths[0]
    manifest = read_manifest(folder)
    made_with = manifest["tokenizer"]
    run = tokenizer_identity(load_tokenizer(cfg.tokenizer, cfg.separator_token))
    differ = [k for k in ("sha256", "vocab_size", "separator_id", "special_tokens") if run[k] != made_with[k]]
    if differ:
        raise ConfigError(
            f"the shards in {folder} were made with the tokenizer {made_with['name']} ({_describe(made_with)}) but "
            f"DataConfig.tokenizer={cfg.tokenizer!r} is {_describe(run)}; set DataConfig.tokenizer (and "
            "separator_token) to the shards' tokenizer, or prepare the data again with this one")
    return manifest


def _describe(identity: dict) -> str:
    return (f"sha256 {identity['sha256'][:12]}, {identity['vocab_size']} tokens, separator "
            f"{identity['separator_id']}")


class ShardStream:
    """Random access to windows of one split's packed stream, read from its shards.

    Records are numbered across the split's shards in order. Position p of the stream lies in shard i with
    token_starts[i] <= p < token_starts[i + 1], in that shard's record (p - token_starts[i]) // chunk_tokens.
    """

    def __init__(self, folder: str, split: str):
        import grain  # imports jax (seconds), which prepare-data does not need

        manifest = read_manifest(folder)
        info = manifest["splits"][split]
        self.n_tokens = int(info["tokens"])
        self._chunk = int(manifest["chunk_tokens"])
        self._dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        self._paths = [str(epath.Path(folder) / s["file"]) for s in info["shards"]]
        records = [int(s["records"]) for s in info["shards"]]
        for path, count in zip(self._paths, records):
            try:
                reader = array_record_module.ArrayRecordReader(path)
                found = reader.num_records()
                reader.close()
            except (OSError, RuntimeError, ValueError) as e:
                raise _corrupt(path, str(e)) from e
            if found != count:
                raise _corrupt(path, f"{found} records where {MANIFEST} lists {count}")
        self._token_starts = np.cumsum([0] + [int(s["tokens"]) for s in info["shards"]])
        self._record_starts = np.cumsum([0] + records)
        self._source = (grain.sources.ArrayRecordDataSource([f"{p}[0:{n}]" for p, n in zip(self._paths, records)])
                        if self._paths else None)

    def _shard(self, record: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._record_starts, record, side="right") - 1

    def _record_at(self, position: np.ndarray) -> np.ndarray:
        shard = np.searchsorted(self._token_starts, position, side="right") - 1
        return self._record_starts[shard] + (position - self._token_starts[shard]) // self._chunk

    def _record_span(self, record: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First stream position and token count of each record."""
        shard = self._shard(record)
        first = self._token_starts[shard] + (record - self._record_starts[shard]) * self._chunk
        return first, np.minimum(self._chunk, self._token_starts[shard + 1] - first)

    def _records(self, ids: list[int]) -> list[np.ndarray]:
        try:
            raw = self._source.__getitems__(ids)
        except (OSError, RuntimeError, ValueError) as e:
            raise self._locate_failure(ids, e) from e
        _, lengths = self._record_span(np.array(ids))
        out = []
        for i, data, expected in zip(ids, raw, lengths * self._dtype.itemsize):
            if len(data) != expected:
                raise _corrupt(self._path_of(i), f"record {i} holds {len(data)} bytes, expected {expected}")
            out.append(np.frombuffer(data, self._dtype))
        return out

    def _path_of(self, record: int) -> str:
        return self._paths[int(self._shard(np.array(record)))]

    def _locate_failure(self, ids: list[int], error: Exception) -> ConfigError:
        for i in ids:
            try:
                self._source[i]
            except (OSError, RuntimeError, ValueError) as e:
                return _corrupt(self._path_of(i), f"record {i}: {e}")
        return ConfigError(f"reading the shards {self._paths[0]}, ... failed ({error}) although every record "
                           "reads alone; the filesystem may be flaky: resume the run from its checkpoint")

    def windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """int32[len(starts), width]: the stream's tokens [s, s + width) for each start s."""
        first = self._record_at(starts)
        last = self._record_at(starts + width - 1)
        ids = sorted({int(r) for a, b in zip(first, last) for r in range(a, b + 1)})
        records = dict(zip(ids, self._records(ids)))
        offsets = starts - self._record_span(first)[0]
        out = np.empty((len(starts), width), np.int32)
        for row, (offset, a, b) in enumerate(zip(offsets, first, last)):
            span = np.concatenate([records[r] for r in range(a, b + 1)])
            out[row] = span[offset:offset + width]
        return out


def _corrupt(path: str, why: str) -> ConfigError:
    return ConfigError(f"the ArrayRecord shard {path} is corrupt ({why}); rerun `celerity prepare-data` "
                       "into a new folder, or restore the shard from a copy")
