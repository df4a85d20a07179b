"""Reference curves: building them, and choosing and combining them for a run.

A reference (types.Reference, stored as JSON by files.py) is a normalized curve on a t̂ grid with its
controls and provenance, built from finished curves of one size (averaged over the seeds given) or from
the fitted surrogate. A run may only be compared with references whose collapse controls (TPP, τ,
schedule), offset and loss curve match its own, unless forced (`check_controls`, `load_checked`); references of
several sizes combine into the family-aware curve at the run's N (curves.family_curve; which way a prediction
combines them is predictor.py's choice). A reference built from runs shorter than the short-run regime
(regime.py) gets a warning line (`regime_notes`): its shape is not that of longer runs.
"""

import dataclasses
import datetime
import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from celerity_jax.collapse import curves, regime, surrogate
from celerity_jax.collapse.config import CurveGrid, MonitorConfig
from celerity_jax.collapse.controls import Controls
from celerity_jax.collapse.files import load_reference
from celerity_jax.collapse.types import Curve, Reference
from celerity_jax.errors import ConfigError


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def reference_from_curves(runs: list[Curve], n_bins: int, smooth_bins: int, offset: float = 0.0,
                          force: bool = False) -> Reference:
    """Seed-averaged normalized curve of finished runs of one size with the same controls; its provenance records
    each run's source and total steps."""
    for run in runs:
        differ = run.controls.mismatches(runs[0].controls)
        n0, n1 = runs[0].controls.n_params, run.controls.n_params
        if n0 and n1 and n0 != n1:
            differ.append(f"n_params {n1:.4g} vs {n0:.4g}")
        if differ and not force:
            raise ConfigError(f"{run.source}: controls differ from {runs[0].source} ({', '.join(differ)}); "
                              "a reference averages seeds of one size and recipe. Pass --force to mix them")
    normalized, finals = zip(*(curves.normalize_run(run, n_bins, smooth_bins, offset) for run in runs))
    normalized_KxG = np.stack(normalized)
    provenance = {"kind": "curves", "sources": [r.source for r in runs],
                  "total_steps": [int(r.total_steps) for r in runs], "loss_curve": runs[0].loss,
                  "n_seeds": len(runs), "n_bins": n_bins, "smooth_bins": smooth_bins, "created": _now()}
    return Reference(curves.bin_centers(n_bins), normalized_KxG.mean(axis=0),
                     normalized_KxG.std(axis=0, ddof=1) if len(runs) > 1 else None, runs[0].controls,
                     float(offset), float(np.mean(finals)), provenance)


def reference_from_surrogate(constants: surrogate.SurrogateConstants, controls: Controls, n_bins: int,
                             source: str = "") -> Reference:
    """The surrogate's normalized curve for the given τ, TPP and schedule (warmup_frac default 0; a wsd schedule's
    decay fraction its default when unknown)."""
    missing = [n for n in ("tau", "tpp", "schedule") if getattr(controls, n) is None]
    if missing:
        raise ConfigError(f"the surrogate needs the controls {missing}; pass them (--tau, --tpp, --schedule)")
    frac_G = curves.bin_centers(n_bins)
    eta_G, eta_end = surrogate.schedule_on_grid(frac_G, controls.schedule, controls.warmup_frac or 0.0,
                                                controls.wsd_decay_frac)
    curve_G = surrogate.surrogate_curve(frac_G, eta_G, eta_end, constants.b(controls.tau),
                                        constants.q(controls.tpp))
    if not bool(jnp.all(jnp.isfinite(curve_G)) and jnp.all(curve_G > 0)):
        raise ConfigError(f"the surrogate {source or dataclasses.asdict(constants)} gives no finite positive curve "
                          f"at τ = {controls.tau:g}, TPP = {controls.tpp:g} (b = {constants.b(controls.tau):.3g}, "
                          f"q = {constants.q(controls.tpp):.3g}); these controls are probably far outside the "
                          "runs it was fitted on: fit it on runs nearer to them (`celerity collapse fit`)")
    provenance = {"kind": "surrogate", "constants": dataclasses.asdict(constants), "source": source,
                  "n_bins": n_bins, "created": _now()}
    return Reference(frac_G, np.asarray(curve_G), None, controls, 0.0, None, provenance)


def reference_curve(refs: list[Reference], frac_G: np.ndarray, n_params: float | None = None) -> jnp.ndarray:
    """The references' normalized curve on `frac_G`: family-aware at N = `n_params` when they span
    several sizes (each with its N), else their geometric mean."""
    on_grid_KxG = jnp.stack([jnp.interp(jnp.asarray(frac_G, jnp.float32), r.frac_G, r.normalized_G)
                             for r in refs])
    sizes = [r.controls.n_params for r in refs]
    if n_params is None or None in sizes:
        sizes, n_params = [1.0] * len(refs), 1.0
    return curves.family_curve(on_grid_KxG, jnp.asarray(sizes), n_params)


def check_controls(refs: Sequence[Reference], run: Controls, run_name: str, force: bool = False,
                   offset: float = 0.0, loss_curve: str = "train") -> list[str]:
    """Refuses references whose TPP, τ, schedule or offset differ from the run's (or each other's), or that were
    built from another loss curve than the run's `loss_curve` ("train" or "eval"; references from before the
    curve was recorded in their provenance were built from training curves; surrogate ones are not checked).

    Returns notes on what could not be checked; with `force`, mismatches become notes too.
    """
    notes, problems = [], []
    for ref in refs:
        problems += [f"{ref.source}: {m} (reference vs run)" for m in ref.controls.mismatches(run)]
        problems += [f"{ref.source}: {m} (vs {refs[0].source})" for m in ref.controls.mismatches(refs[0].controls)]
        if abs(ref.offset - offset) > 1e-12:
            problems.append(f"{ref.source}: offset L0 {ref.offset:g} vs {offset:g}")
        built_from = ref.provenance.get("loss_curve", "train") if ref.provenance.get("kind") == "curves" else None
        if built_from not in (None, loss_curve):
            problems.append(f"{ref.source}: built from {built_from} curves, the run's is its {loss_curve} curve")
        unknown = ref.controls.unknown(run)
        if unknown:
            notes.append(f"{ref.source}: not checked against {run_name}: {', '.join(unknown)} unknown")
    if problems and not force:
        raise ConfigError(f"references do not match {run_name}: {'; '.join(problems)}. A normalized curve "
                          "depends on TPP, τ and the schedule, and on the loss curve it was built from; use "
                          "references with the same controls, built from the same curve (`celerity collapse "
                          "reference --loss-curve`), or force it (--force; TrainConfig.force_reference when training)")
    return notes + [f"forced: {p}" for p in problems]


def load_checked(paths: Sequence[str], cfg: CurveGrid | MonitorConfig, controls: Controls,
                 run_name: str = "the run", force: bool = False,
                 loss_curve: str | None = None) -> tuple[list[Reference], list[str]]:
    """Loads reference JSONs for a run and returns (references, notes).

    `cfg` is a CurveGrid, or a MonitorConfig (its grid). Refuses references whose TPP, τ, schedule or offset
    differ from `controls`, or that were built from another loss curve than the run's (`loss_curve`, "train" or
    "eval"; by default the MonitorConfig's, else "train"), unless `force` (`check_controls`).
    """
    grid = cfg.grid if isinstance(cfg, MonitorConfig) else cfg
    loss_curve = loss_curve or (cfg.loss_curve if isinstance(cfg, MonitorConfig) else "train")
    if not paths:
        raise ConfigError("no reference given; build one with `celerity collapse reference`")
    refs = [load_reference(p) for p in paths]
    return refs, check_controls(refs, controls, run_name, force, grid.offset, loss_curve)


def reference_on_grid(paths: Sequence[str], cfg: CurveGrid | MonitorConfig, controls: Controls,
                      run_name: str = "the run", force: bool = False,
                      loss_curve: str | None = None) -> tuple[jnp.ndarray, list[str]]:
    """The references of `load_checked` as one curve on the grid of `cfg`: (reference_G, notes). With several
    sizes (and controls.n_params known) the curve is the family-aware one at the run's N (`reference_curve`);
    a prediction picks its method instead (predictor.method_for)."""
    refs, notes = load_checked(paths, cfg, controls, run_name, force, loss_curve)
    if controls.n_params is None and len({r.controls.n_params for r in refs}) > 1:
        notes.append(f"N of {run_name} unknown: its reference is the mean over the references' sizes")
    grid = cfg.grid if isinstance(cfg, MonitorConfig) else cfg
    return reference_curve(refs, curves.bin_centers(grid.n_bins), controls.n_params), notes


def regime_notes(refs: Sequence[Reference]) -> list[str]:
    """One warning line (regime.outside) per reference built from runs shorter than the short-run regime, naming
    the reference, its tokens (TPP·N) and the total steps of its shortest run. A reference from before the steps
    were recorded is checked on its tokens alone, one whose N or TPP is unknown on its steps alone; a surrogate
    reference has no run and no warning."""
    lines = []
    for ref in refs:
        if ref.provenance.get("kind") != "curves":
            continue
        n, tpp = ref.controls.n_params, ref.controls.tpp
        tokens = None if n is None or tpp is None else int(round(n * tpp))
        steps = min(ref.provenance["total_steps"]) if ref.provenance.get("total_steps") else None
        if tokens is None and steps is None:
            continue
        short = regime.outside(regime.MIN_STEPS if steps is None else steps,
                               regime.MIN_TOKENS if tokens is None else tokens)
        if short:
            size = ", ".join(["tokens unknown" if tokens is None else f"{tokens:,} tokens",
                              "steps unknown" if steps is None else f"{steps:,} steps"])
            lines.append(f"reference {ref.source} ({size}): {short}")
    return lines


def nearest(refs: Sequence[Reference], n_params: float) -> Reference:
    """The reference nearest to N = `n_params` in log N (the first such); references of unknown N count only
    when no reference's N is known (then it is the first of them)."""
    known = [r for r in refs if r.controls.n_params is not None] or list(refs)
    return min(known, key=lambda r: abs(math.log((r.controls.n_params or n_params) / n_params)))
