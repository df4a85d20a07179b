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
import queue
import time

from celerity_jax import recipe
from celerity_jax.aot import workers
from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import Setting, estimate_pieces, slice_devices
from celerity_jax.aot.walk import MIN_HEADROOM, MeshWalk, new_row, usable
from celerity_jax.errors import ConfigError
from celerity_jax.model.config import REMATS

STATE_BYTES_PER_PARAM = 16  # float32 params, gradients and two Adam moments


def candidate_meshes(chips: int, n_heads: int) -> list[tuple[int, int, int]]:
    meshes = [(1, chips, 1), (chips, 1, 1)]
    meshes += [(1, chips // t, t) for t in (2, 4) if chips % t == 0 and chips > t and n_heads % t == 0]
    return list(dict.fromkeys(meshes))


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


def _skipped(setting: Setting, reason: str) -> dict:
    return new_row(setting, skipped=reason)


def _failed(setting: Setting, e: Exception) -> dict:
    """The row of a compile that raised: a ConfigError names the problem itself."""
    reason = str(e) if isinstance(e, ConfigError) else f"the compile failed: {e}"
    return dict(_skipped(setting, reason), error=str(e))


def search(configs, topology: str, *, cache: Cache = Cache(None), meshes=None, jobs: int = 1,
           budget_seconds: float | None = None, log=print) -> Search:
    """The chosen report (None when nothing fits), every report tried, and how the search ended; `meshes`
    replaces the candidate meshes. With a cache directory, the pieces of each estimate compile side by side."""
    start = time.monotonic()
    slice_, _ = slice_devices(topology)
    plan = recipe.make_plan(configs.model, configs.recipe)
    tried, walks, estimated = [], [], []
    settled_by: dict[Setting, MeshWalk] = {}
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

    def advance(walk: MeshWalk):
        for row in walk.rows:
            _put(tried, row)
            note(row)
        for row in walk.settled:
            settled_by[Setting.of_report(row)] = walk
            estimate(Setting.of_report(row))
        walk.rows, walk.settled = [], []
        if walk.compile_index is not None:
            index, walk.compile_index = walk.compile_index, None
            compiler.submit(("step", walk, index),
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
                walks.append(MeshWalk(configs, topology, mesh_shape, plan))
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
                tag[1].record(tag[2], result)
                note(result)
                advance(tag[1])
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
                    # the model was wrong there: the sizes under it are walked again
                    walks.append(settled_by[tag[1]].below(row))
                    advance(walks[-1])
            best = min(estimated, key=rank) if estimated else None
            if best and best.get("by_model") and Setting.of_report(best) not in checking:
                # the leader's memory is checked by XLA as soon as it leads: the winner's is XLA's
                leader = Setting.of_report(best)
                checking.add(leader)
                compiler.submit(("check", leader), ("estimate", configs, topology, leader, cache.directory))
    except TimeoutError:
        stopped = "budget"
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        compiler.close(stop=stopped is not None)
    return Search(best=_best(estimated, tried), tried=tried, stopped=stopped,
                  seconds=round(time.monotonic() - start, 1), compiles=done)


def _row(tried: list[dict], setting: Setting) -> dict:
    """The row of `setting` (its step compile, or the model's verdict)."""
    return next(r for r in tried if "skipped" not in r and Setting.of_report(r) == setting)


def _put(tried: list[dict], row: dict):
    """Adds `row`, or replaces the row of its setting: a walk again (`MeshWalk.below`) decides afresh."""
    same = [i for i, r in enumerate(tried) if "skipped" not in r and Setting.of_report(r) == Setting.of_report(row)]
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
