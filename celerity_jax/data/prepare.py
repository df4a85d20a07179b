"""`celerity prepare-data` on one machine: a corpus into an ArrayRecord folder, on every core, resumably.

The corpus is cut into tasks (`corpus.plan_tasks`), tokenized in worker processes (at most two tasks per
worker in flight) and taken back in task order. Consecutive task results form a shard group as soon as
it holds `shard_tokens` tokens (`cut_groups`); each group becomes one shard per split
(`arrayrecord.write_group`). Nothing depends on the worker count, so the folder is byte-identical for
any --workers, and for the Beam pipeline (`beam`), which uses the same functions.

Atomic and resumable: --out is built in the hidden folder `.NAME.partial` beside it and renamed to --out
when complete. After each group, progress.json there records the groups written, the next task and the
counts, so a stopped or killed run, rerun with the same arguments, inputs and task plan, continues after
the last finished group. A bad input (a malformed record with on_bad_record='fail', an empty training
split) removes the partial folder: such a run cannot be resumed. --out is local: ArrayRecord's writer
writes local files only (copy the folder to a bucket afterwards, or write to a gcsfuse mount).
"""

import collections
import fcntl
import hashlib
import itertools
import json
import multiprocessing
import os
import pathlib
import shutil
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from celerity_jax.data import arrayrecord, corpus
from celerity_jax.data.config import DEFAULT_CHUNK_TOKENS, DEFAULT_SHARD_TOKENS, DataConfig
from celerity_jax.data.progress import Progress
from celerity_jax.data.tokenizer import load_tokenizer, token_dtype
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_output_dir, write_json_atomic

PROGRESS = "progress.json"


def cut_groups(counts: Iterable[int], shard_tokens: int) -> Iterator[tuple[int, int]]:
    """[start, end) of consecutive items forming a group once it holds >= shard_tokens; the rest form the last.
    Yields each group as soon as its last count is read, so `counts` may be a stream."""
    start, held, n = 0, 0, 0
    for n, count in enumerate(counts, start=1):
        held += count
        if held >= shard_tokens:
            yield start, n
            start, held = n, 0
    if n > start:
        yield start, n


def describe_sources(files: list[corpus.InputFile]) -> list[dict]:
    out = []
    for f in files:
        stat = os.stat(f.path)
        out.append({"path": f.path, "bytes": stat.st_size, "mtime": stat.st_mtime})
    return out


def plan_digest(tasks: list[corpus.Task]) -> str:
    """SHA-256 of the task plan (the pieces of each task): a resumed run must cut the corpus the same way."""
    plan = [[(p.path, p.row_group) for p in task.pieces] for task in tasks]
    return hashlib.sha256(json.dumps(plan).encode()).hexdigest()


def identity(cfg: DataConfig, files: list[corpus.InputFile], tasks: list[corpus.Task], chunk_tokens: int,
             shard_tokens: int) -> dict:
    """What decides the folder's bytes: settings, tokenizer, sources and task plan. A resumed run must match it."""
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.separator_token)
    settings = {"source": cfg.source, "paths": list(cfg.paths), "val_paths": list(cfg.val_paths),
                "val_fraction": cfg.val_fraction, "text_column": cfg.text_column,
                "on_bad_record": cfg.on_bad_record, "separator_token": cfg.separator_token}
    return {"format": arrayrecord.FORMAT, "tokenizer": arrayrecord.tokenizer_identity(tokenizer),
            "dtype": token_dtype(tokenizer.vocab_size).name, "chunk_tokens": chunk_tokens,
            "shard_tokens": shard_tokens, "settings": settings, "sources": describe_sources(files),
            "task_plan": plan_digest(tasks)}


def write_shard_group(folder: pathlib.Path, group: int, results: list[corpus.TaskResult],
                      ident: dict) -> tuple[dict[str, dict], corpus.ReadReport]:
    """Shard group `group` from its tasks' results, in task order: ({split: shard entry}, what they read)."""
    tokens = {s: [r.tokens[s] for r in results] for s in corpus.SPLITS}
    shards = arrayrecord.write_group(folder, group, tokens, np.dtype(ident["dtype"]), ident["chunk_tokens"])
    report = corpus.ReadReport()
    for result in results:
        report.add(result)
    return shards, report


def write_manifest(cfg: DataConfig, folder: pathlib.Path, ident: dict, report: corpus.ReadReport,
                   shards: dict[str, list[dict]]) -> dict:
    """Writes manifest.json, last: the folder is complete from then on. ConfigError if the training split is
    empty."""
    if not report.tokens["train"]:
        raise corpus.empty_corpus_error(cfg, report)
    manifest = {**ident, "read": report.to_json(), "summary": report.summary(),
                "splits": {s: {"tokens": report.tokens[s], "shards": shards[s]} for s in corpus.SPLITS}}
    write_json_atomic(str(folder / arrayrecord.MANIFEST), manifest)
    return manifest


def check_sizes(chunk_tokens: int, shard_tokens: int) -> None:
    if chunk_tokens < 1 or shard_tokens < 1:
        raise ConfigError(f"--chunk-tokens={chunk_tokens} and --shard-tokens={shard_tokens} must be positive")


def check_out(out_dir: str) -> None:
    """--out must be a new or empty local folder that the finished folder can replace."""
    if "://" in out_dir:
        raise ConfigError(f"--out {out_dir} is a URL, but ArrayRecord writes local files only; prepare into a local "
                          "folder (or a gcsfuse mount) and copy it to the bucket, e.g. gsutil -m cp -r")
    check_output_dir(out_dir, "--out")
    target = os.path.realpath(out_dir)
    if target == os.path.realpath(os.getcwd()) or os.path.ismount(target):
        raise ConfigError(f"--out {out_dir} is the working directory or a mount point, which the finished folder "
                          f"cannot replace; give a folder inside it, e.g. --out {os.path.join(out_dir, 'shards')}")
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise ConfigError(f"--out {out_dir} is not empty; give a new or empty folder (nothing is overwritten)")


def partial_folder(out_dir: str) -> str:
    """Where the folder is built: beside --out (beside a symlink's target)."""
    parent, name = os.path.split(os.path.realpath(out_dir))
    return os.path.join(parent, f".{name}.partial")


class _Journal:
    """progress.json: the groups written, the next task and the counts so far."""

    def __init__(self, folder: pathlib.Path, ident: dict):
        self.folder, self.ident = folder, ident
        self.groups, self.next_task = 0, 0
        self.report = corpus.ReadReport()
        self.shards: dict[str, list[dict]] = {s: [] for s in corpus.SPLITS}

    def load(self) -> bool:
        """Reads a journal left by a stopped run; False if there is none. ConfigError if it is another job's."""
        path = self.folder / PROGRESS
        if not path.exists():
            return False
        try:
            saved = json.loads(path.read_text())
            differ = [k for k in self.ident if saved["identity"].get(k) != self.ident[k]]
            groups, next_task, shards = saved["groups"], saved["next_task"], saved["shards"]
            report = corpus.ReadReport.from_json(saved["read"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path} is unreadable ({e!r}); delete {self.folder} to start over") from e
        if differ:
            raise ConfigError(f"{self.folder} holds an unfinished prepare-data whose {', '.join(differ)} differ from "
                              "this one's; rerun the command that started it (same inputs and flags) to resume, or "
                              f"delete {self.folder} to start over")
        self.groups, self.next_task, self.shards, self.report = groups, next_task, shards, report
        return True

    def save(self) -> None:
        data = {"identity": self.ident, "groups": self.groups, "next_task": self.next_task,
                "read": self.report.to_json(), "shards": self.shards}
        write_json_atomic(str(self.folder / PROGRESS), data)

    def clear_unlisted(self) -> None:
        """Removes files of a group that was being written when the run stopped."""
        keep = {PROGRESS} | {s["file"] for shards in self.shards.values() for s in shards}
        for path in self.folder.iterdir():
            if path.name not in keep:
                path.unlink()


def _init_worker() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool is the parallelism: one thread per worker


def _tokenized(cfg: DataConfig, tasks: list[corpus.Task], pool, workers: int) -> Iterator[corpus.TaskResult]:
    if pool is None:
        yield from (corpus.tokenize_task(cfg, task) for task in tasks)
        return
    todo = iter(tasks)
    in_flight = collections.deque(pool.submit(corpus.tokenize_task, cfg, task)
                                  for task in itertools.islice(todo, 2 * workers))
    while in_flight:
        result = in_flight.popleft().result()
        in_flight.extend(pool.submit(corpus.tokenize_task, cfg, task) for task in itertools.islice(todo, 1))
        yield result


def _write_groups(cfg: DataConfig, tasks: list[corpus.Task], journal: _Journal, workers: int,
                  progress: Progress) -> None:
    # spawn: forking a process whose tokenizer has run threads can deadlock
    pool = (ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker)
            if workers > 1 else None)
    held: list[corpus.TaskResult] = []

    def token_counts():
        for result in _tokenized(cfg, tasks[journal.next_task:], pool, workers):
            held.append(result)
            progress.update(result.n_bytes, result.n_files, result.n_tokens)
            yield result.n_tokens

    try:
        for _ in cut_groups(token_counts(), journal.ident["shard_tokens"]):
            shards, report = write_shard_group(journal.folder, journal.groups, held, journal.ident)
            for split, entry in shards.items():
                journal.shards[split].append(entry)
            journal.report.merge(report)
            journal.groups += 1
            journal.next_task += len(held)
            held.clear()
            journal.save()
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def lock_folder(folder: str) -> int:
    """An exclusive lock on the folder, held until the returned descriptor is closed; ConfigError if taken."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"another prepare-data is writing {folder}; wait for it to finish, or stop it") from None
    return fd


def prepare(cfg: DataConfig, out_dir: str, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int = 1, stream=None) -> dict:
    """Tokenizes the documents of `cfg` (source "stdlib" or "text") into the shard folder `out_dir`; returns
    its manifest, with the closing summary under "closing". Progress, resume and stop notices go to `stream`
    (default stderr)."""
    stream = stream or sys.stderr
    check_sizes(chunk_tokens, shard_tokens)
    if workers < 1:
        raise ConfigError(f"--workers={workers} must be at least 1")
    check_out(out_dir)
    files = corpus.input_files(cfg)  # bad paths and tokenizers fail here, before anything is created
    tasks = corpus.plan_tasks(files)
    ident = identity(cfg, files, tasks, chunk_tokens, shard_tokens)
    work = partial_folder(out_dir)
    os.makedirs(work, exist_ok=True)
    lock = lock_folder(work)
    try:
        journal = _Journal(pathlib.Path(work), ident)
        if journal.load():  # another job's journal is refused here, and its folder kept
            print(f"prepare-data: resuming {work}: {journal.groups} shard groups "
                  f"({sum(journal.report.tokens.values()):,} tokens) done, from task {journal.next_task} of "
                  f"{len(tasks)}", file=stream)
        manifest = _build(cfg, tasks, journal, workers, stream)
    finally:
        os.close(lock)
    rename_into_place(work, out_dir)
    os.unlink(os.path.join(out_dir, PROGRESS))  # kept until the rename: a kill before it loses nothing
    return manifest


def _build(cfg: DataConfig, tasks: list[corpus.Task], journal: _Journal, workers: int, stream) -> dict:
    """Writes the remaining groups and the manifest; a bad input removes the folder."""
    done = tasks[:journal.next_task]
    progress = Progress(sum(t.n_bytes for t in tasks), sum(t.n_files for t in tasks),
                        sum(t.n_bytes for t in done), sum(t.n_files for t in done), stream=stream)
    try:
        journal.clear_unlisted()
        _write_groups(cfg, tasks, journal, workers, progress)
        manifest = write_manifest(cfg, journal.folder, journal.ident, journal.report, journal.shards)
    except ConfigError:
        progress.close()
        shutil.rmtree(journal.folder, ignore_errors=True)  # a bad input: nothing to resume
        raise
    except BaseException:
        progress.close()
        print(f"prepare-data: stopped after {journal.groups} shard groups; rerun the same command to resume from "
              f"{journal.folder}", file=stream)
        raise
    return {**manifest, "closing": progress.close()}


def rename_into_place(work: str, out_dir: str) -> None:
    """Moves the finished folder to --out; if that fails, the finished folder stays where it is, named."""
    try:
        os.rename(work, os.path.realpath(out_dir))  # replaces an empty folder; refuses one that is no longer empty
    except OSError as e:
        raise ConfigError(f"--out {out_dir}: the finished folder cannot be renamed to it ({e.strerror}: was something "
                          f"written there meanwhile?); it is complete at {work}: move it where you want it") from e
