"""`celerity compile --search`: the setting with the best estimated step time that fits with headroom.

For each mesh (all fsdp; all data; fsdp × tensor 2 and 4 where the heads split), starting from one sequence
per data shard and no remat: a microbatch that fits is followed by one twice as large, for as long as the
estimate improves; one that does not fit is retried with more remat (none, dots, full). So at most
(microbatch sizes + remat levels) compiles per mesh. Meshes whose optimizer state alone cannot fit, and
batches that do not split over a mesh, are not compiled. The search compiles with scan_layers (fast to
compile at any depth). The estimate does not depend on scanning (see `estimate`), so the chosen setting is
also compiled unrolled and kept unrolled when that needs less memory.
"""

from celerity_jax import recipe
from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import Setting, compile_report, slice_devices
from celerity_jax.model.config import REMATS

MIN_HEADROOM = 0.10
SAME_ESTIMATE = 0.01  # the estimates of the scanned and unrolled compiles differ by rounding only
STATE_BYTES_PER_PARAM = 16  # float32 params, gradients and two Adam moments


def usable(report: dict) -> bool:
    return report["fits"] and report["headroom"] >= MIN_HEADROOM


def candidate_meshes(chips: int, n_heads: int) -> list[tuple[int, int, int]]:
    meshes = [(1, chips, 1), (chips, 1, 1)]
    meshes += [(1, chips // t, t) for t in (2, 4) if chips % t == 0 and chips > t and n_heads % t == 0]
    return list(dict.fromkeys(meshes))


def microbatch_seqs(per_shard: int) -> list[int]:
    """Sequences per data shard in one microbatch: powers of two that divide the shard's batch, then all of it."""
    sizes = [s for s in (2**i for i in range(12)) if s < per_shard and per_shard % s == 0]
    return sizes + [per_shard]


def _rank(report: dict):
    """Best first: estimated step time, then fewer microbatches and less remat (when no estimate), then bytes."""
    est = report["est_step_seconds"]
    return (est if est is not None else float("inf"), report["microbatches"], REMATS.index(report["remat"]),
            report["bytes_per_chip"])


def _skipped(setting: Setting, reason: str) -> dict:
    return {"mesh_shape": list(setting.mesh_shape), "microbatches": setting.microbatches, "remat": setting.remat,
            "scan_layers": setting.scan_layers, "fits": False, "skipped": reason, "bytes_per_chip": None,
            "headroom": None, "est_step_seconds": None, "est_mfu": None}


def search(configs, topology: str, *, cache: Cache = Cache(None), try_unrolled: bool = True, meshes=None,
           log=print) -> tuple[dict | None, list[dict]]:
    """(the chosen report or None, every report tried); `try_unrolled` False skips the unrolled compile; `meshes`
    replaces the candidate meshes."""
    slice_, _ = slice_devices(topology)
    plan = recipe.make_plan(configs.model, configs.recipe)
    tried = []

    def attempt(setting: Setting) -> dict:
        report = compile_report(configs, topology, setting, cache=cache)
        tried.append(report)
        log(format_row(report))
        return report

    for mesh in meshes or candidate_meshes(slice_.chips, configs.model.n_heads):
        shards = mesh[0] * mesh[1]
        state_bytes = plan.n_params * STATE_BYTES_PER_PARAM / (mesh[1] * mesh[2])
        if plan.batch_seqs % shards:
            tried.append(_skipped(Setting(mesh, 1, "none", True), f"the batch of {plan.batch_seqs} does not split "
                                  f"over {shards} data shards"))
            continue
        if state_bytes > (1 - MIN_HEADROOM) * slice_.chip.hbm_bytes:
            tried.append(_skipped(Setting(mesh, 1, "none", True), f"the optimizer state alone needs "
                                  f"{state_bytes / 1e9:.0f} GB per chip"))
            continue
        per_shard = plan.batch_seqs // shards
        sizes, remats = microbatch_seqs(per_shard), iter(REMATS)
        remat, best_here, i = next(remats), None, 0
        while i < len(sizes) and remat:
            report = attempt(Setting(mesh, per_shard // sizes[i], remat, True))
            if not usable(report):
                remat = next(remats, None)  # the same microbatch with more remat
            elif best_here and _rank(report) >= _rank(best_here):
                break  # larger microbatches stopped paying
            else:
                best_here, i = report, i + 1
    fitting = sorted((r for r in tried if "skipped" not in r and usable(r)), key=_rank)
    if not fitting:
        return None, tried
    best = fitting[0]
    if not try_unrolled:
        return best, tried
    unrolled = attempt(Setting(tuple(best["mesh_shape"]), best["microbatches"], best["remat"], False))
    same_estimate = (unrolled["est_step_seconds"] or 0) <= (1 + SAME_ESTIMATE) * (best["est_step_seconds"] or 0)
    if usable(unrolled) and same_estimate and unrolled["bytes_per_chip"] < best["bytes_per_chip"]:
        best = unrolled
    return best, tried


def format_row(report: dict) -> str:
    """One line of the search's progress / table."""
    setting = (f"mesh {tuple(report['mesh_shape'])} micro {report['microbatches']:>3} remat {report['remat']:<4} "
               f"scan {'y' if report['scan_layers'] else 'n'}")
    if "skipped" in report:
        return f"{setting}  skipped: {report['skipped']}"
    gb = f"{report['bytes_per_chip'] / 1e9:7.1f} GB" if report["bytes_per_chip"] else "      ? GB"
    fit = "fits" if usable(report) else ("tight" if report["fits"] else "OOM ")
    est = (f"  est {report['est_step_seconds']:.3f} s/step, MFU {report['est_mfu']:.0%}"
           if report.get("est_step_seconds") else "")
    return f"{setting}  {fit} {gb}{est}"
