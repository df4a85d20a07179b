"""The grain pipeline the trainer codes against: train iterator, held-out eval batches, model checks.

A split is one packed token stream (see `corpus`). Sequence i of an epoch is the window
stream[i·L : i·L + L + 1] (inputs its first L tokens, targets its last L), so every token but the
first is a target exactly once per epoch. The documented tail: the last (n_tokens − 1) mod L tokens
of the stream, fewer than L, are never served. The grain MapDataset over window indices is

  range(n_windows) → shuffle (seeded, reshuffled every epoch) → repeat → [process_index::process_count]
  → batch(batch_seqs) → gather the windows

so global batch k is windows k·G … k·G + G − 1 of the endless shuffled order (G = batch_seqs ·
process_count), host p reads rows p, p + P, … of it, and batches run across epoch boundaries without
dropping a window. The iterator state is the index of the next batch, so a restored iterator yields
exactly what an uninterrupted one would. With DataConfig.read_workers = n, n grain worker processes read
and assemble the batches ahead of the trainer (from batch k, worker i makes batches k + i, k + i + n, …, taken
in turn), so the batches and their order are unchanged; `TrainIterator.close()` stops the workers.
"""

import atexit
import functools
import warnings
import weakref

import numpy as np

from celerity_jax.data import arrayrecord, corpus
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import load_tokenizer
from celerity_jax.errors import ConfigError


class MemoryStream:
    """Random access to windows of a packed stream held in memory."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = tokens
        self.n_tokens = tokens.size

    def windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """int32[len(starts), width]: the stream's tokens [s, s + width) for each start s."""
        return self.tokens[starts[:, None] + np.arange(width)].astype(np.int32)


def _stream(cfg: DataConfig, split: str):
    if cfg.source == "arrayrecord":
        arrayrecord.checked_manifest(cfg)
        return arrayrecord.ShardStream(cfg.paths[0], split)
    loaded = corpus.load_corpus(cfg)
    return MemoryStream(loaded.train if split == "train" else loaded.val)


def corpus_stats(cfg: DataConfig) -> dict:
    """Size of the corpus in tokens (both splits), its tokenizer and what was read or skipped."""
    if cfg.source != "arrayrecord":
        return dict(corpus.load_corpus(cfg).stats)
    manifest = arrayrecord.checked_manifest(cfg)
    return {"source": "arrayrecord", "tokenizer": manifest["tokenizer"]["name"],
            "vocab_size": manifest["tokenizer"]["vocab_size"], "train_tokens": manifest["splits"]["train"]["tokens"],
            "val_tokens": manifest["splits"]["val"]["tokens"], "prepared_from": manifest["summary"]}


def tokenizer_vocab_size(cfg: DataConfig) -> int:
    """Number of token ids the data can contain (the model's vocab_size must be at least this)."""
    if cfg.source == "arrayrecord":
        return int(arrayrecord.checked_manifest(cfg)["tokenizer"]["vocab_size"])
    return load_tokenizer(cfg.tokenizer, cfg.separator_token).vocab_size


def tokenizer_label(cfg: DataConfig) -> str:
    """How an error names the data's tokenizer, and where it comes from."""
    where = "the built-in corpus" if cfg.source == "stdlib" else ", ".join(cfg.paths)
    return f"{cfg.tokenizer!r} tokenizer of {where}"


# A model vocabulary this many times the data's is made for another tokenizer (padding a vocabulary to a round size
# adds far less).
VOCAB_MISMATCH_RATIO = 4


def check_vocab(tokenizer_vocab: int, model_vocab: int, tokenizer_name: str = "") -> None:
    """ConfigError unless every token id fits the model's embedding table, and the table is made for this data's
    tokenizer: a model vocabulary VOCAB_MISMATCH_RATIO times the data's expects another tokenized corpus."""
    if model_vocab >= VOCAB_MISMATCH_RATIO * tokenizer_vocab:
        raise ConfigError(
            f"ModelConfig.vocab_size={model_vocab:,} is made for another tokenizer than the data's ({tokenizer_name}"
            f"{': ' if tokenizer_name else ''}{tokenizer_vocab:,} token ids): this config expects a corpus tokenized with its own "
            "tokenizer (the Celerity configs: the Llama-3 tokenizer, 128,256 ids). Make one with `celerity "
            "prepare-data --input FILES --tokenizer TOKENIZER.json --out DIR`, then train with DataConfig.source = "
            "'arrayrecord', DataConfig.paths = ('DIR',) and DataConfig.tokenizer = 'TOKENIZER.json' "
            "(docs/data.md)")
    if tokenizer_vocab > model_vocab:
        raise ConfigError(f"the tokenizer has {tokenizer_vocab} token ids but ModelConfig.vocab_size="
                          f"{model_vocab}; set ModelConfig.vocab_size to at least {tokenizer_vocab} or use a "
                          "smaller tokenizer (DataConfig.tokenizer)")


def _check_layout(seq_len: int, batch_seqs: int, process_index: int, process_count: int) -> None:
    if seq_len < 1 or batch_seqs < 1:
        raise ConfigError(f"seq_len={seq_len} and batch_seqs={batch_seqs} must be positive")
    if not 0 <= process_index < process_count:
        raise ConfigError(f"process_index={process_index} must lie in [0, process_count={process_count})")


def _batch(stream, window_ids: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    seq_BxL1 = stream.windows(window_ids * seq_len, seq_len + 1)
    return {"inputs": np.ascontiguousarray(seq_BxL1[:, :-1]), "targets": np.ascontiguousarray(seq_BxL1[:, 1:])}


def _n_windows(stream, seq_len: int, split: str, cfg: DataConfig) -> int:
    n = (stream.n_tokens - 1) // seq_len if stream.n_tokens else 0
    if n < 1:
        raise ConfigError(f"the {split} split of DataConfig.source={cfg.source!r} has {stream.n_tokens} tokens, "
                          f"fewer than one sequence of {seq_len + 1}; give more text or a shorter seq_len")
    return n


class TrainIterator:
    """Yields {"inputs", "targets"}: int32[batch_seqs, seq_len] numpy batches; see the module docstring."""

    def __init__(self, cfg: DataConfig, seq_len: int, batch_seqs: int, *, seed: int,
                 process_index: int = 0, process_count: int = 1):
        import grain  # imports jax (seconds): only the iterator needs it

        _check_layout(seq_len, batch_seqs, process_index, process_count)
        if seed < 0 or cfg.shuffle_seed < 0:
            raise ConfigError(f"the data seeds (seed={seed}, DataConfig.shuffle_seed={cfg.shuffle_seed}) must "
                              "be non-negative")
        self._cfg, self._seq_len = cfg, seq_len
        self._stream = _stream(cfg, "train")
        self.n_windows = _n_windows(self._stream, seq_len, "train", cfg)
        self.global_batch_seqs = batch_seqs * process_count
        # grain reseeds each epoch with (shuffle seed + epoch) mod 2**32.
        shuffle_seed = int(np.random.SeedSequence([cfg.shuffle_seed, seed]).generate_state(1)[0])
        # A partial, not a bound method: the workers are sent the dataset pickled, and so everything it holds.
        gather = functools.partial(_batch, self._stream, seq_len=seq_len)
        self._dataset = (grain.MapDataset.range(self.n_windows).shuffle(seed=shuffle_seed).repeat()
                         [process_index::process_count].batch(batch_seqs).map(gather))
        # Every host is at the same batch, so a state saved by one host restores on any other.
        self._identity = {"seq_len": seq_len, "batch_seqs": batch_seqs, "process_count": process_count,
                          "seed": seed, "shuffle_seed": cfg.shuffle_seed, "train_tokens": int(self._stream.n_tokens)}
        self._next_batch = 0
        self._warned = False
        self._workers = None  # with read_workers: a grain iterator fed by worker processes, at self._next_batch
        if cfg.read_workers:
            # grain's own exit hook stops only the processes; its iterators fail to close once modules are torn down.
            atexit.register(_close_if_alive, weakref.ref(self))

    @property
    def batches_per_epoch(self) -> float:
        """Global batches in one pass over the training split."""
        return self.n_windows / self.global_batch_seqs

    def __iter__(self) -> "TrainIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        k = self._next_batch
        epoch = ((k + 1) * self.global_batch_seqs - 1) // self.n_windows
        if epoch >= 1:
            self._past_end(k, epoch)
        batch = self._from_workers() if self._cfg.read_workers else self._dataset[k]
        self._next_batch = k + 1
        return batch

    def _from_workers(self) -> dict[str, np.ndarray]:
        if self._workers is None:
            import grain
            from absl import flags

            # grain reads an absl flag when it starts workers: an error until absl has parsed flags, which celerity
            # never asks it to.
            if not flags.FLAGS.is_parsed():
                flags.FLAGS.mark_as_parsed()
            # Worker i makes elements i, i + n, … of this dataset and grain takes one from each worker in turn, so
            # the order is the dataset's. The workers are the parallelism: each makes one batch at a time.
            batches = self._dataset[self._next_batch:].to_iter_dataset(grain.ReadOptions(num_threads=0))
            options = grain.MultiprocessingOptions(num_workers=self._cfg.read_workers, per_worker_buffer_size=2)
            self._workers = iter(batches.mp_prefetch(options))
        # Copied out of grain's shared memory, which a batch still held at interpreter exit would leak.
        return {name: np.array(x) for name, x in next(self._workers).items()}

    def close(self) -> None:
        """Stops the read workers, if any; safe to call twice, and a later `next` starts them again at the current
        batch. Without a call they stop when this iterator is garbage-collected or the interpreter exits."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def _past_end(self, k: int, epoch: int) -> None:
        size = (f"{self.n_windows} sequences of {self._seq_len + 1} tokens, {self.batches_per_epoch:.1f} batches "
                f"of {self.global_batch_seqs}")
        if not self._cfg.allow_repeat:
            raise ConfigError(f"the training split ({size}) is used up at batch {k} and DataConfig.allow_repeat="
                              "False; give more data, train fewer steps, or set allow_repeat=True to repeat it")
        if not self._warned:
            self._warned = True
            warnings.warn(f"the training split ({size}) is used up: batch {k} starts epoch {epoch + 1}, so data "
                          "repeats from here on (DataConfig.allow_repeat=True; this warning is shown once)",
                          RuntimeWarning, stacklevel=3)

    def get_state(self) -> dict:
        """JSON-serialisable position; `set_state` on a like-built iterator resumes exactly here."""
        return {"next_batch": self._next_batch, **self._identity}

    def set_state(self, state: dict) -> None:
        """Resume from `get_state()`; ConfigError if the state came from a differently built iterator."""
        changed = [f"{k}: {state.get(k)!r} saved, {v!r} now" for k, v in self._identity.items() if state.get(k) != v]
        if changed:
            raise ConfigError("the saved data-iterator state does not match this run (" + "; ".join(changed) +
                              "), so resuming would not reproduce its batches; restore the data/recipe config "
                              "of the saved run or start a new run")
        next_batch = state.get("next_batch")
        if not isinstance(next_batch, int) or next_batch < 0:
            raise ConfigError(f"the saved data-iterator state has next_batch={next_batch!r}; expected an integer >= 0")
        self.close()  # the workers read ahead from the old position
        self._next_batch = next_batch


def _close_if_alive(iterator_ref: weakref.ref) -> None:
    iterator = iterator_ref()
    if iterator is not None:
        iterator.close()


def make_train_iterator(cfg: DataConfig, seq_len: int, batch_seqs: int, *, seed: int,
                        process_index: int = 0, process_count: int = 1) -> TrainIterator:
    """This process's training batches; `batch_seqs` rows per process (global batch = batch_seqs·count)."""
    return TrainIterator(cfg, seq_len, batch_seqs, seed=seed, process_index=process_index,
                         process_count=process_count)


def make_eval_batches(cfg: DataConfig, seq_len: int, batch_seqs: int, n_batches: int, *,
                      process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """Fixed held-out batches: n_batches·batch_seqs·process_count windows of the validation split spread
    evenly over it; this process gets rows process_index::process_count of each global batch."""
    _check_layout(seq_len, batch_seqs, process_index, process_count)
    stream = _stream(cfg, "val")
    n_windows = _n_windows(stream, seq_len, "validation", cfg)
    global_batch = batch_seqs * process_count
    need = n_batches * global_batch
    if need > n_windows:
        raise ConfigError(f"the validation split holds {n_windows} sequences of {seq_len + 1} tokens, fewer than "
                          f"the {n_batches} eval batches of {global_batch} asked for; ask for fewer eval batches "
                          "or raise DataConfig.val_fraction (or give DataConfig.val_paths)")
    window_ids = (np.arange(need) * n_windows) // need
    batches = []
    for k in range(n_batches):
        rows = window_ids[k * global_batch:(k + 1) * global_batch][process_index::process_count]
        batches.append(_batch(stream, rows, seq_len))
    return batches
