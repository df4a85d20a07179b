"""The compiles of `celerity compile --search`, in this process or in a pool of worker processes: a task is a
compile report of a step (`StepTask`) or one piece of an estimate compiled into the cache (`PieceTask`)."""

import dataclasses
import heapq
import itertools
import multiprocessing
import os
import queue
import signal
from typing import Any, ClassVar

from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import GradientPiece, StepSetting, UpdatePiece, compile_piece, compile_report
from celerity_jax.errors import ConfigError
from celerity_jax.processes import die_with_parent


@dataclasses.dataclass(frozen=True)
class StepTask:
    """A compile report (`aot.compile.compile_report`) of the step with `setting`; `estimates` as there:
    "never" (the step's memory), "fits" (with the estimate) or "only" (the estimate without compiling the step)."""
    configs: Any
    topology: str
    setting: StepSetting
    cache_dir: str | None
    estimates: str

    @property
    def urgency(self) -> int:
        return 0 if self.estimates == "never" else 1  # the step compiles that decide a walk come first

    def run(self) -> dict:
        return compile_report(self.configs, self.topology, self.setting, cache=Cache(self.cache_dir),
                              estimates=self.estimates)


@dataclasses.dataclass(frozen=True)
class PieceTask:
    """One piece of the estimate of the step with `setting`, compiled into the cache."""
    configs: Any
    topology: str
    setting: StepSetting
    cache_dir: str | None
    piece: UpdatePiece | GradientPiece
    urgency: ClassVar[int] = 2

    def run(self) -> None:
        compile_piece(self.configs, self.topology, self.setting, self.piece, Cache(self.cache_dir))


def run_task(task: StepTask | PieceTask):
    return task.run()


def _start_worker():
    import jax

    # A search killed outright (SIGTERM, SIGKILL) would leave its workers compiling for minutes.
    die_with_parent(multiprocessing.parent_process().pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle
    # A worker's results and errors come back through the pool; what libtpu writes to stderr (start-up warnings,
    # and a crash report when a stopped search terminates the worker) would only bury the search's own lines.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    jax.config.update("jax_platforms", "cpu")


class Compiler:
    """Compiles, in this process (jobs 1) or in a pool of `jobs` processes; finished ones in a queue. A compile is
    handed to a worker only when one is free, the most urgent first: the step compiles that decide the walk, then
    the short ones that finish an estimate, then the estimates' pieces. A compile that raises gives
    `failed(setting, exception)` as its result (in this process: a ConfigError only)."""

    def __init__(self, jobs: int, failed):
        self.results = queue.Queue()
        self.waiting: list[tuple[int, int, Any, StepTask | PieceTask]] = []
        self.jobs, self.in_flight, self.running, self.order = jobs, 0, 0, itertools.count()
        self.failed = failed
        self.pool = (multiprocessing.get_context("spawn").Pool(jobs, initializer=_start_worker) if jobs > 1
                     else None)

    def submit(self, task: StepTask | PieceTask, tag):
        """Queues `task`; its result comes back from `next` with `tag`."""
        self.running += 1
        heapq.heappush(self.waiting, (task.urgency, next(self.order), tag, task))
        self._fill()

    def _fill(self):
        while self.pool is not None and self.waiting and self.in_flight < self.jobs:
            _, _, tag, task = heapq.heappop(self.waiting)
            self.in_flight += 1
            self.pool.apply_async(run_task, (task,), callback=lambda r, tag=tag: self.results.put((tag, r)),
                                  error_callback=lambda e, tag=tag, task=task: self.results.put(
                                      (tag, self.failed(task.setting, e))))

    def next(self, timeout: float | None):
        """(tag, result) of a finished compile; queue.Empty after `timeout` seconds."""
        if self.pool is None and self.results.empty():
            _, _, tag, task = heapq.heappop(self.waiting)
            try:
                result = run_task(task)
            except ConfigError as e:
                result = self.failed(task.setting, e)
            self.results.put((tag, result))
        tag, result = self.results.get(timeout=timeout)
        self.running -= 1
        if self.pool is not None:
            self.in_flight -= 1
            self._fill()
        return tag, result

    def close(self, stop: bool):
        if self.pool is not None:
            (self.pool.terminate if stop else self.pool.close)()
            self.pool.join()
