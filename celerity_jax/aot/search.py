"""`celerity compile --search`: the setting with the best estimated step time that fits with headroom.

The settings are the candidate meshes (all fsdp; all data; fsdp × tensor 2 and 4 where the heads split) ×
microbatch sizes (sequences per data shard: the powers of two that divide the shard's batch, and all of it) ×
remat (`model.config.REMATS`, in order of recompute). Two assumptions order them: on one mesh, a larger
microbatch is never slower (fewer passes over the weights), and more remat is never faster (more recompute). So
for each mesh and remat only the largest microbatch that fits can win, and only when it is larger than the
largest that fits with less remat.

For each mesh, remat by remat, from the largest microbatch the footprint model (`aot.footprint`) says may fit:
1. where the model is sure, it decides (`aot.walk`); elsewhere the step is compiled for its memory, and the
   model is scaled by XLA's bytes over its own from then on;
2. a size that fits is followed by the next size up, one that does not by the next size down;
3. the largest that fits gets XLA's step-time estimate (`aot.estimate`: loop-free pieces, compiled side by side).
The leading estimate's step is compiled (if it was not) before it wins, so the chosen setting's memory is XLA's;
where that compile does not fit, the sizes below it are walked again (then more remat, up to its size).
Meshes whose optimizer state alone cannot fit, and batches that do not split over a mesh, are not compiled.
Compiles run in `jobs` processes; the search stops at `budget_seconds` or at Ctrl-C with the best setting found
so far. The steps compile with scan_layers, fast at any depth; the estimate does not depend on it.
"""

import dataclasses
import functools
import queue
import time

from celerity_jax import recipe
from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import StepSetting, UpdatePiece, estimate_pieces, slice_devices
from celerity_jax.aot.row import MIN_HEADROOM, Row, Verdict, usable
from celerity_jax.aot.walk import MeshWalk
from celerity_jax.aot.workers import Compiler, PieceTask, StepTask
from celerity_jax.errors import ConfigError
from celerity_jax.model.config import REMATS

STATE_BYTES_PER_PARAM = 16  # float32 params, gradients and two Adam moments


def candidate_meshes(chips: int, n_heads: int) -> list[tuple[int, int, int]]:
    meshes = [(1, chips, 1), (chips, 1, 1)]
    meshes += [(1, chips // t, t) for t in (2, 4) if chips % t == 0 and chips > t and n_heads % t == 0]
    return list(dict.fromkeys(meshes))


def rank(row: Row):
    """Best first: estimated step time, then fewer microbatches and less remat (when no estimate), then bytes."""
    est = row.est_step_seconds
    return (est if est is not None else float("inf"), row.setting.microbatches, REMATS.index(row.setting.remat),
            row.bytes_per_chip or float("inf"))


@dataclasses.dataclass
class Search:
    best: Row | None
    tried: list[Row]
    stopped: str | None  # None, "budget" or "interrupted"
    seconds: float
    compiles: int


def _failed(setting: StepSetting, e: Exception) -> Row:
    """The row of a compile that raised: a ConfigError names the problem itself."""
    reason = str(e) if isinstance(e, ConfigError) else f"the compile failed: {e}"
    return Row(setting, skipped=reason, error=str(e))


def search(configs, topology: str, *, cache: Cache = Cache(None), meshes=None, jobs: int = 1,
           budget_seconds: float | None = None, log=print) -> Search:
    """The chosen row (None when nothing fits), every row tried, and how the search ended; `meshes` replaces the
    candidate meshes. With a cache directory, the pieces of each estimate compile side by side."""
    return _Searcher(configs, topology, cache, jobs, log).run(meshes, budget_seconds)


class _Searcher:
    """One search: its rows, its walks, the estimates waiting for their pieces, and the compiles in flight, each
    submitted with the method that takes its result."""

    def __init__(self, configs, topology: str, cache: Cache, jobs: int, log):
        self.start = time.monotonic()
        self.configs, self.topology, self.cache_dir, self.log = configs, topology, cache.directory, log
        self.slice_, _ = slice_devices(topology)
        self.plan = recipe.make_plan(configs.model, configs.recipe)
        self.tried: list[Row] = []
        self.walks: list[MeshWalk] = []
        self.estimated: list[StepSetting] = []  # those with an estimate that can win, in the order estimated
        self.settled_by: dict[StepSetting, MeshWalk] = {}
        self.pieces_left: dict[StepSetting, int] = {}
        # one update piece serves every setting of a mesh: mesh -> the settings waiting while it compiles, None after
        self.updates: dict[tuple, list[StepSetting] | None] = {}
        self.checking: set[StepSetting] = set()
        self.compiler = Compiler(jobs, failed=_failed)
        self.done = 0

    def run(self, meshes, budget_seconds: float | None) -> Search:
        stopped = None
        try:
            for mesh_shape in meshes or candidate_meshes(self.slice_.chips, self.configs.model.n_heads):
                reason = self._unsplittable(mesh_shape)
                if reason:
                    self.tried.append(Row(StepSetting(mesh_shape, 1, "none", True), skipped=reason))
                else:
                    self._add_walk(MeshWalk(self.configs, self.topology, mesh_shape, self.plan))
            self._take_results(budget_seconds)
        except TimeoutError:
            stopped = "budget"
        except KeyboardInterrupt:
            stopped = "interrupted"
        finally:
            self.compiler.close(stop=stopped is not None)
        return Search(best=self._best(), tried=self.tried, stopped=stopped,
                      seconds=round(time.monotonic() - self.start, 1), compiles=self.done)

    def _unsplittable(self, mesh_shape) -> str | None:
        """Why no setting of the mesh is tried: the batch does not split over it, or the optimizer state alone does
        not fit its chips."""
        shards, model_chips = mesh_shape[0] * mesh_shape[1], mesh_shape[1] * mesh_shape[2]
        state_bytes = self.plan.n_params * STATE_BYTES_PER_PARAM / model_chips
        if self.plan.batch_seqs % shards:
            return f"the batch of {self.plan.batch_seqs} does not split over {shards} data shards"
        if state_bytes > (1 - MIN_HEADROOM) * self.slice_.chip.hbm_bytes:
            return f"the optimizer state alone needs {state_bytes / 1e9:.0f} GB per chip"
        return None

    def _take_results(self, budget_seconds: float | None):
        """Hands each finished compile to the method it was submitted with, until none is left; TimeoutError when
        the budget is spent."""
        while self.compiler.running:
            left = None if budget_seconds is None else budget_seconds - (time.monotonic() - self.start)
            if left is not None and left <= 0:
                raise TimeoutError
            try:
                take, result = self.compiler.next(timeout=left)
            except queue.Empty:
                raise TimeoutError from None
            self.done += 1
            take(result)
            self._check_leader()

    def _note(self, row: Row):
        seconds = int(time.monotonic() - self.start)
        left = self.compiler.running + sum(w.compile_index is not None for w in self.walks)
        self.log(f"{format_row(row)}  [{self.done} compiled, {left} or more to go, "
                 f"{seconds // 60}m{seconds % 60:02d}s]")

    def _task(self, setting: StepSetting, estimates: str) -> StepTask:
        return StepTask(self.configs, self.topology, setting, self.cache_dir, estimates)

    def _add_walk(self, walk: MeshWalk):
        self.walks.append(walk)
        self._advance(walk)

    def _advance(self, walk: MeshWalk):
        """Logs the walk's new rows, estimates the settings it settled, and compiles the step it waits for."""
        for row in walk.rows:
            _put(self.tried, row)
            self._note(row)
        for row in walk.settled:
            self.settled_by[row.setting] = walk
            self._estimate(row.setting)
        walk.rows, walk.settled = [], []
        if walk.compile_index is not None:
            index, walk.compile_index = walk.compile_index, None
            self.compiler.submit(self._task(walk.setting(index), "never"),
                                 functools.partial(self._step_compiled, walk, index))

    def _step_compiled(self, walk: MeshWalk, index: int, result: dict | Row):
        walk.record(index, result if isinstance(result, Row) else Row.of_step_compile(result))
        self._advance(walk)

    def _estimate(self, setting: StepSetting):
        """Compiles the pieces of the setting's estimate that are not compiling yet, then assembles it."""
        pieces = estimate_pieces(self.configs, self.topology, setting) if self.cache_dir else []
        waits = False
        if UpdatePiece() in pieces and setting.mesh_shape in self.updates:
            pieces.remove(UpdatePiece())
            waits = self.updates[setting.mesh_shape] is not None
            if waits:
                self.updates[setting.mesh_shape].append(setting)
        elif UpdatePiece() in pieces:
            self.updates[setting.mesh_shape] = []
        self.pieces_left[setting] = len(pieces) + waits
        for piece in pieces:
            self.compiler.submit(PieceTask(self.configs, self.topology, setting, self.cache_dir, piece),
                                 functools.partial(self._piece_compiled, setting, piece))
        if not self.pieces_left[setting]:
            self._assemble(setting)

    def _piece_compiled(self, setting: StepSetting, piece, _result: None | Row):
        finished = [setting]
        if piece == UpdatePiece():
            finished += self.updates[setting.mesh_shape]
            self.updates[setting.mesh_shape] = None
        for waiting in finished:
            self.pieces_left[waiting] -= 1
            if not self.pieces_left[waiting]:  # every piece is cached: the estimate only assembles them
                self._assemble(waiting)

    def _assemble(self, setting: StepSetting):
        estimates = "fits" if _row(self.tried, setting).by_model is None else "only"
        self.compiler.submit(self._task(setting, estimates), functools.partial(self._estimated, setting))

    def _estimated(self, setting: StepSetting, result: dict | Row):
        self.done -= 1  # the estimate compiles nothing of its own
        self._update(_row(self.tried, setting).updated(result))

    def _checked(self, setting: StepSetting, result: dict | Row):
        """Takes XLA's compile of a leader the model alone said fits."""
        row = dataclasses.replace(_row(self.tried, setting), by_model=None).updated(result)
        self._update(row)
        if not usable(row) and row.bytes_per_chip:
            # the model was wrong there: the sizes under it are walked again
            self._add_walk(self.settled_by[setting].below(row))

    def _update(self, row: Row):
        """Puts the row of an estimate or a check in place of its setting's, among the estimates that can win if
        it has one."""
        _put(self.tried, row)
        self._note(row)
        if row.est_step_seconds and (usable(row) or row.by_model == Verdict.FITS):
            if row.setting not in self.estimated:
                self.estimated.append(row.setting)
        elif row.setting in self.estimated:
            self.estimated.remove(row.setting)

    def _check_leader(self):
        """The leader's memory is checked by XLA as soon as it leads: the winner's is XLA's."""
        leader = min(self._estimated_rows(), key=rank) if self.estimated else None
        if leader and leader.by_model and leader.setting not in self.checking:
            self.checking.add(leader.setting)
            self.compiler.submit(self._task(leader.setting, "fits"),
                                 functools.partial(self._checked, leader.setting))

    def _estimated_rows(self) -> list[Row]:
        return [_row(self.tried, setting) for setting in self.estimated]

    def _best(self) -> Row | None:
        """The best estimate; without one (a search stopped early), the best setting that fits, by XLA or the
        model."""
        if self.estimated:
            return min(self._estimated_rows(), key=rank)
        fitting = [r for r in self.tried if r.skipped is None and (usable(r) or r.by_model == Verdict.FITS)]
        return min(fitting, key=rank) if fitting else None


def _row(tried: list[Row], setting: StepSetting) -> Row:
    """The row of `setting` (its step compile, or the model's verdict)."""
    return next(r for r in tried if r.skipped is None and r.setting == setting)


def _put(tried: list[Row], row: Row):
    """Adds `row`, or replaces the row of its setting: a walk again (`MeshWalk.below`) decides afresh."""
    same = [i for i, r in enumerate(tried) if r.skipped is None and r.setting == row.setting]
    if same:
        tried[same[0]] = row
    else:
        tried.append(row)


def search_summary(found: Search) -> str:
    """The search's last line: how it ended, its compiles and time, and the setting it chose."""
    how = {None: "searched", "budget": "STOPPED EARLY at the budget", "interrupted": "STOPPED EARLY (Ctrl-C)"}
    chosen = (f"best so far: {format_row(found.best)}" if found.stopped and found.best else
              f"chose: {format_row(found.best)}" if found.best else "nothing fits")
    return (f"{how[found.stopped]}: {found.compiles} programs compiled or read from the cache in "
            f"{found.seconds:.0f} s; {chosen}")


def format_row(row: Row) -> str:
    """One line of the search's progress / table: XLA's GB (and the footprint model's), or the model's alone where
    it decided without a compile."""
    setting = (f"mesh {tuple(row.setting.mesh_shape)} micro {row.setting.microbatches:>3} "
               f"remat {row.setting.remat:<4} scan {'y' if row.setting.scan_layers else 'n'}")
    if row.skipped is not None:
        return f"{setting}  skipped: {row.skipped}"
    est = f"  est {row.est_step_seconds:.3f} s/step, MFU {row.est_mfu:.0%}" if row.est_step_seconds else ""
    if row.by_model:
        verdict = "fits" if row.by_model == Verdict.FITS else "OOM "
        return f"{setting}  {verdict} {row.model_bytes / 1e9:7.1f} GB by the footprint model{est}"
    model = f" (model {row.model_bytes / 1e9:.1f})" if row.model_bytes else ""
    gb = f"{row.bytes_per_chip / 1e9:7.1f} GB" if row.bytes_per_chip else "      ? GB"
    fit = "fits" if usable(row) else ("tight" if row.fits else "OOM ")
    return f"{setting}  {fit} {gb}{model}{est}"
