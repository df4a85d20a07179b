"""`celerity compile --search`: the setting with the best estimated step time that fits with headroom.

The settings are the candidate meshes (all fsdp; all data; fsdp × tensor 2 and 4 where the heads split) ×
microbatch sizes (sequences per data shard: the powers of two that divide the shard's batch, and all of it) ×
remat (none, dots, full). Two assumptions order them: on one mesh, a larger microbatch is never slower (fewer
passes over the weights), and more remat is never faster (more recompute). So for each mesh and remat only the
largest microbatch that fits can win, and only when it is larger than the largest that fits with less remat.

For each mesh, remat by remat, from the largest microbatch the footprint model (`aot.footprint`) says may fit:
1. where the model is sure, it decides (`_MeshWalk`); elsewhere the step is compiled for its memory, and the
   model is scaled by XLA's bytes over its own from then on;
2. a size that fits is followed by the next size up, one that does not by the next size down;
3. the largest that fits gets XLA's step-time estimate (`aot.estimate`: loop-free pieces, compiled side by side).
The leading estimate's step is compiled (if it was not) before it wins, so the chosen setting's memory is XLA's;
where that compile does not fit, the sizes below it are walked again (then more remat, up to its size).
Meshes whose optimizer state alone cannot fit, and batches that do not split over a mesh, are not compiled.
Compiles run in `jobs` processes; the search stops at `budget_seconds` or at Ctrl-C with the best setting found
so far. The steps compile with scan_layers, fast at any depth; the estimate does not depend on it.
"""

import collections
import dataclasses
import itertools
import queue
import time

from celerity_jax import accelerators, recipe
from celerity_jax.aot import footprint, workers
from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import Setting, Target, apply_setting, estimate_pieces, slice_devices
from celerity_jax.errors import ConfigError
from celerity_jax.model import sharding
from celerity_jax.model.config import REMATS

MIN_HEADROOM = 0.10
STATE_BYTES_PER_PARAM = 16  # float32 params, gradients and two Adam moments
# The footprint model has been within these factors of XLA's bytes on the Celerity configs
# (docs/results/compile.md): a size it puts under limit / SURE_FITS fits, one over SLACK × limit does not; a size
# in between is compiled. A setting the model alone says fits is compiled when it leads, before it is chosen.
SURE_FITS = 1.6
SLACK = 1.2


def usable(report: dict) -> bool:
    return bool(report.get("fits")) and (report.get("headroom") or 0) >= MIN_HEADROOM


def candidate_meshes(chips: int, n_heads: int) -> list[tuple[int, int, int]]:
    meshes = [(1, chips, 1), (chips, 1, 1)]
    meshes += [(1, chips // t, t) for t in (2, 4) if chips % t == 0 and chips > t and n_heads % t == 0]
    return list(dict.fromkeys(meshes))


def microbatch_seqs(per_shard: int) -> list[int]:
    """Sequences per data shard in one microbatch: powers of two that divide the shard's batch, then all of it."""
    sizes = [s for s in (2**i for i in range(12)) if s < per_shard and per_shard % s == 0]
    return sizes + [per_shard]


def rank(report: dict):
    """Best first: estimated step time, then fewer microbatches and less remat (when no estimate), then bytes."""
    est = report.get("est_step_seconds")
    return (est if est is not None else float("inf"), report["microbatches"], REMATS.index(report["remat"]),
            report["bytes_per_chip"] or float("inf"))


@dataclasses.dataclass
class Search:
    best: dict | None
    tried: list[dict]
    stopped: str | None  # None, "budget" or "interrupted"
    seconds: float
    compiles: int


def _new_row(setting: Setting, **fields) -> dict:
    """A row of `tried` for a setting nothing has compiled yet."""
    return {"mesh_shape": list(setting.mesh_shape), "microbatches": setting.microbatches, "remat": setting.remat,
            "scan_layers": setting.scan_layers, "fits": False, "bytes_per_chip": None, "model_bytes": None,
            "headroom": None, "est_step_seconds": None, "est_mfu": None, **fields}


def _skipped(setting: Setting, reason: str) -> dict:
    return _new_row(setting, skipped=reason)


def _failed(setting: Setting, e: Exception) -> dict:
    """The row of a compile that raised: a ConfigError names the problem itself."""
    reason = str(e) if isinstance(e, ConfigError) else f"the compile failed: {e}"
    return dict(_skipped(setting, reason), error=str(e))


class _MeshWalk:
    """The walk over one mesh's (remat, microbatch size) settings. A size is decided by the footprint model,
    scaled by XLA's bytes over its own at the mesh's last compile, where the model is sure (fits even when
    SURE_FITS × more; does not fit even at SLACK × less); otherwise its step is compiled. Too many bytes would
    drop a setting unseen, so the model errs low where it must guess (tensor meshes), and a setting it alone
    says fits is compiled when it leads."""

    def __init__(self, configs, topology: str, mesh_shape, plan, *, remats=REMATS, floor=-1, tops=None,
                 ratio=1.0):
        """The keywords walk part of a mesh again (`below`): its remats, the size index the first of them must
        pass, the size index each must stay under, and the model's scale."""
        slice_, devices = slice_devices(topology)
        self.configs, self.topology, self.mesh_shape, self.plan = configs, topology, tuple(mesh_shape), plan
        self.platform = slice_.chip.platform
        self.limit = (1 - MIN_HEADROOM) * accelerators.usable_bytes(slice_.chip)  # as `usable` judges a compile
        self.mesh = sharding.make_mesh(self.mesh_shape, devices=devices)
        self.per_shard = plan.batch_seqs // sharding.data_shards(self.mesh)
        self.sizes = microbatch_seqs(self.per_shard)
        self.tops = tops or {}
        self.state = footprint.state_bytes(Target.of(configs, topology, Setting(self.mesh_shape, 2, "none",
                                                                                  True)).build())
        self.remats = collections.deque(remats)
        self.floor = floor  # index of the largest size that fits with less remat
        self.floors: dict[str, int] = {}  # remat -> the floor it walked above
        self.fits_at: dict[str, int] = {}  # remat -> the index it settled at
        self.ratio = ratio  # XLA's bytes over the model's, at the mesh's last compile
        self.fit: dict[int, dict] = {}  # index -> the row of a size that fits, this remat
        self.decided: set[int] = set()
        self.rows: list[dict] = []  # decided by the model, to be logged
        self.settled: list[dict] = []  # the largest fitting size of each remat, to be estimated
        self.compile_index = self._walk(self._first_index())

    def setting(self, index: int) -> Setting:
        return Setting(self.mesh_shape, self.per_shard // self.sizes[index], self.remats[0], True)

    def model_bytes(self, index: int) -> float:
        run = apply_setting(self.configs, self.setting(index), self.platform)
        return footprint.footprint(run.model, self.mesh, microbatches=self.per_shard // self.sizes[index],
                                   micro_seqs=self.plan.batch_seqs * self.sizes[index] // self.per_shard,
                                   seq_len=self.plan.seq_len, state=self.state).total

    def _verdict(self, index: int) -> str:
        scaled = self.model_bytes(index) * self.ratio
        return "fits" if scaled * SURE_FITS <= self.limit else "no" if scaled > SLACK * self.limit else "compile"

    def _first_index(self) -> int | None:
        above = range(self.floor + 1, self._top())
        maybe = [i for i in above if self._verdict(i) != "no"]
        return maybe[-1] if maybe else (above[0] if above else None)

    def _walk(self, index: int | None) -> int | None:
        """Decides sizes by the model from `index` on, remat by remat; the next size to compile, or None when the
        mesh is done."""
        while self.remats:
            if index is None:
                self._settle()
                index = self._first_index() if self.remats else None
                continue
            verdict = self._verdict(index)
            if verdict == "compile":
                return index
            self.decided.add(index)
            row = _new_row(self.setting(index), model_bytes=self.model_bytes(index), by_model=verdict)
            self.rows.append(row)
            index = self._next(index, verdict == "fits", row)
        return None

    def _next(self, index: int, fits: bool, row: dict) -> int | None:
        if fits:
            self.fit[index] = row
            up = index + 1
            return up if up < self._top() and up not in self.decided else None
        down = index - 1
        return down if down > self.floor and down not in self.decided and down not in self.fit else None

    def _top(self) -> int:
        return self.tops.get(self.remats[0], len(self.sizes))

    def _settle(self):
        self.floors[self.remats[0]] = self.floor
        if self.fit:
            self.floor = self.fits_at[self.remats[0]] = max(self.fit)
            self.settled.append(self.fit[self.floor])
        self.remats.popleft()
        self.fit, self.decided = {}, set()

    def below(self, report: dict) -> "_MeshWalk":
        """The walk again under a setting this walk settled by the model that XLA's compile says does not fit,
        with the model scaled by XLA's bytes there: its remat under its size, then each more remat that settled
        nothing here up to its size (above it, this walk has decided them)."""
        remat, index = report["remat"], self.sizes.index(self.per_shard // report["microbatches"])
        more = itertools.takewhile(lambda r: r not in self.fits_at, REMATS[REMATS.index(remat) + 1:])
        tops = {remat: index, **{r: index + 1 for r in more}}
        return _MeshWalk(self.configs, self.topology, self.mesh_shape, self.plan, remats=tuple(tops),
                         floor=self.floors[remat], tops=tops, ratio=report["bytes_per_chip"] / report["model_bytes"])

    def record(self, index: int, report: dict):
        """Takes the step compile at `index` and walks on."""
        self.decided.add(index)
        report["model_bytes"] = self.model_bytes(index)
        if report.get("bytes_per_chip"):
            self.ratio = report["bytes_per_chip"] / report["model_bytes"]
        self.compile_index = self._walk(self._next(index, usable(report), report))


def search(configs, topology: str, *, cache: Cache = Cache(None), meshes=None, jobs: int = 1,
           budget_seconds: float | None = None, log=print) -> Search:
    """The chosen report (None when nothing fits), every report tried, and how the search ended; `meshes`
    replaces the candidate meshes. With a cache directory, the pieces of each estimate compile side by side."""
    start = time.monotonic()
    slice_, _ = slice_devices(topology)
    plan = recipe.make_plan(configs.model, configs.recipe)
    tried, walks, estimated = [], [], []
    settled_by: dict[Setting, _MeshWalk] = {}
    pieces_left: dict[Setting, int] = {}
    # one update piece serves every setting of a mesh: mesh -> the settings waiting while it compiles, None after
    updates: dict[tuple, list[Setting] | None] = {}
    checking = set()
    compiler = workers.Compiler(jobs, failed=_failed)
    done = 0

    def note(report: dict):
        seconds = int(time.monotonic() - start)
        left = compiler.running + sum(w.compile_index is not None for w in walks)
        log(f"{format_row(report)}  [{done} compiled, {left} or more to go, {seconds // 60}m{seconds % 60:02d}s]")

    def advance(walk: _MeshWalk):
        for row in walk.rows:
            _put(tried, row)
            note(row)
        for row in walk.settled:
            settled_by[_setting(row)] = walk
            estimate(_setting(row))
        walk.rows, walk.settled = [], []
        if walk.compile_index is not None:
            index, walk.compile_index = walk.compile_index, None
            compiler.submit(("step", walks.index(walk), index),
                            ("step", configs, topology, walk.setting(index), cache.directory))

    def estimate(setting: Setting):
        pieces = estimate_pieces(configs, topology, setting) if cache.directory else []
        waits = False
        if ("update",) in pieces and setting.mesh_shape in updates:
            pieces.remove(("update",))
            waits = updates[setting.mesh_shape] is not None
            if waits:
                updates[setting.mesh_shape].append(setting)
        elif ("update",) in pieces:
            updates[setting.mesh_shape] = []
        pieces_left[setting] = len(pieces) + waits
        for piece in pieces:
            compiler.submit(("piece", setting, piece), ("piece", configs, topology, setting, cache.directory, piece))
        if not pieces_left[setting]:
            assemble(setting)

    def assemble(setting: Setting):
        row = _row(tried, setting)
        kind = "estimate" if row.get("by_model") is None else "estimate only"
        compiler.submit(("estimate", setting), (kind, configs, topology, setting, cache.directory))

    stopped = None
    try:
        for mesh_shape in meshes or candidate_meshes(slice_.chips, configs.model.n_heads):
            shards, model_chips = mesh_shape[0] * mesh_shape[1], mesh_shape[1] * mesh_shape[2]
            state_bytes = plan.n_params * STATE_BYTES_PER_PARAM / model_chips
            if plan.batch_seqs % shards:
                tried.append(_skipped(Setting(mesh_shape, 1, "none", True), f"the batch of {plan.batch_seqs} "
                                      f"does not split over {shards} data shards"))
            elif state_bytes > (1 - MIN_HEADROOM) * slice_.chip.hbm_bytes:
                tried.append(_skipped(Setting(mesh_shape, 1, "none", True), f"the optimizer state alone needs "
                                      f"{state_bytes / 1e9:.0f} GB per chip"))
            else:
                walks.append(_MeshWalk(configs, topology, mesh_shape, plan))
                advance(walks[-1])
        while compiler.running:
            left = None if budget_seconds is None else budget_seconds - (time.monotonic() - start)
            if left is not None and left <= 0:
                raise TimeoutError
            try:
                tag, result = compiler.next(timeout=left)
            except queue.Empty:
                raise TimeoutError from None
            done += 1
            if tag[0] == "step":
                _put(tried, result)
                walk = walks[tag[1]]
                walk.record(tag[2], result)
                note(result)
                advance(walk)
            elif tag[0] == "piece":
                finished = [tag[1]]
                if tag[2] == ("update",):
                    finished += updates[tag[1].mesh_shape]
                    updates[tag[1].mesh_shape] = None
                for setting in finished:
                    pieces_left[setting] -= 1
                    if not pieces_left[setting]:  # every piece is cached: the estimate only assembles them
                        assemble(setting)
            else:  # an estimate, or the check of a setting the model said fits: one row, updated
                done -= tag[0] == "estimate"  # the estimate compiles nothing of its own
                row = _row(tried, tag[1])
                if tag[0] == "check":
                    row.pop("by_model")
                row.update({k: v for k, v in result.items() if k not in ("fits", "bytes_per_chip", "headroom")
                            or row.get("by_model") is None})
                note(row)
                if row.get("est_step_seconds") and (usable(row) or row.get("by_model") == "fits"):
                    if row not in estimated:
                        estimated.append(row)
                elif row in estimated:
                    estimated.remove(row)
                if tag[0] == "check" and not usable(row) and row["bytes_per_chip"]:
                    # the model was wrong there: the smaller sizes of its remat are walked again
                    walks.append(settled_by[tag[1]].below(row))
                    advance(walks[-1])
            best = min(estimated, key=rank) if estimated else None
            if best and best.get("by_model") and _setting(best) not in checking:
                # the leader's memory is checked by XLA as soon as it leads: the winner's is XLA's
                checking.add(_setting(best))
                compiler.submit(("check", _setting(best)), ("estimate", configs, topology, _setting(best),
                                                            cache.directory))
    except TimeoutError:
        stopped = "budget"
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        compiler.close(stop=stopped is not None)
    return Search(best=_best(estimated, tried), tried=tried, stopped=stopped,
                  seconds=round(time.monotonic() - start, 1), compiles=done)


def _setting(row: dict) -> Setting:
    return Setting(tuple(row["mesh_shape"]), row["microbatches"], row["remat"], row["scan_layers"])


def _row(tried: list[dict], setting: Setting) -> dict:
    """The row of `setting` (its step compile, or the model's verdict)."""
    return next(r for r in tried if "skipped" not in r and _setting(r) == setting)


def _put(tried: list[dict], row: dict):
    """Adds `row`, or replaces the row of its setting: a walk again (`_MeshWalk.below`) decides afresh."""
    same = [i for i, r in enumerate(tried) if "skipped" not in r and _setting(r) == _setting(row)]
    if same:
        tried[same[0]] = row
    else:
        tried.append(row)


def _best(estimated: list[dict], tried: list[dict]) -> dict | None:
    """The best estimate; without one (a search stopped early), the best setting that fits, by XLA or the model."""
    if estimated:
        return min(estimated, key=rank)
    fitting = [r for r in tried if "skipped" not in r and (usable(r) or r.get("by_model") == "fits")]
    return min(fitting, key=rank) if fitting else None


def search_summary(found: Search) -> str:
    """The search's last line: how it ended, its compiles and time, and the setting it chose."""
    how = {None: "searched", "budget": "STOPPED EARLY at the budget", "interrupted": "STOPPED EARLY (Ctrl-C)"}
    chosen = (f"best so far: {format_row(found.best)}" if found.stopped and found.best else
              f"chose: {format_row(found.best)}" if found.best else "nothing fits")
    return (f"{how[found.stopped]}: {found.compiles} programs compiled or read from the cache in "
            f"{found.seconds:.0f} s; {chosen}")


def format_row(report: dict) -> str:
    """One line of the search's progress / table: XLA's GB (and the footprint model's), or the model's alone where
    it decided without a compile."""
    setting = (f"mesh {tuple(report['mesh_shape'])} micro {report['microbatches']:>3} remat {report['remat']:<4} "
               f"scan {'y' if report['scan_layers'] else 'n'}")
    if "skipped" in report:
        return f"{setting}  skipped: {report['skipped']}"
    est = (f"  est {report['est_step_seconds']:.3f} s/step, MFU {report['est_mfu']:.0%}"
           if report.get("est_step_seconds") else "")
    if report.get("by_model"):
        verdict = "fits" if report["by_model"] == "fits" else "OOM "
        return f"{setting}  {verdict} {report['model_bytes'] / 1e9:7.1f} GB by the footprint model{est}"
    model = f" (model {report['model_bytes'] / 1e9:.1f})" if report.get("model_bytes") else ""
    gb = f"{report['bytes_per_chip'] / 1e9:7.1f} GB" if report["bytes_per_chip"] else "      ? GB"
    fit = "fits" if usable(report) else ("tight" if report["fits"] else "OOM ")
    return f"{setting}  {fit} {gb}{model}{est}"
