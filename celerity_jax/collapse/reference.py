"""Reference curves: a normalized curve on a t̂ grid with its controls and provenance, stored as JSON.

Built from finished curves of one size (averaged over the seeds given) or from the fitted surrogate.
A run may only be compared with references whose collapse controls (TPP, τ, schedule) match its own,
unless forced; references of several sizes combine into the family-aware curve at the run's N.
"""

import dataclasses
import datetime

import jax.numpy as jnp
import numpy as np

from celerity_jax.collapse import curves, family, surrogate
from celerity_jax.collapse.loading import Controls, Curve, controls_from_mapping, read_json
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic

FORMAT = "celerity-collapse-reference/1"


@dataclasses.dataclass(frozen=True)
class Reference:
    frac_G: np.ndarray
    normalized_G: np.ndarray
    seed_std_G: np.ndarray | None   # across the seeds it averages; None for one seed or the surrogate
    controls: Controls
    offset: float                   # L0 of the normalization (L − L0)/(L_T − L0)
    final_loss: float | None        # mean final (smoothed) loss of its runs
    provenance: dict
    source: str = "built in memory"  # the file it was loaded from


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def normalize_run(run: Curve, n_bins: int, smooth_bins: int, offset: float = 0.0) -> tuple[np.ndarray, float]:
    """(normalized curve on the grid, final smoothed loss) of a finished run, or ConfigError."""
    if not run.finished:
        raise ConfigError(f"{run.source}: the curve stops at step {int(run.step_T[-1])} of {run.total_steps}; "
                          "this needs finished runs (`collapse predict` takes partial ones)")
    if offset >= run.loss_T.min():
        raise ConfigError(f"{run.source}: offset L0 = {offset} is not below the loss "
                          f"(min {run.loss_T.min():.4g}); lower --offset")
    mean_G, _ = curves.smooth(*curves.bin_curve(run.frac_T, run.loss_T, n_bins), smooth_bins)
    if not bool(jnp.all(jnp.isfinite(mean_G))):
        raise ConfigError(f"{run.source}: {len(run.step_T)} points leave gaps on a {n_bins}-bin grid "
                          f"smoothed over {smooth_bins} bins; use fewer --bins or more --smooth-bins")
    return np.asarray(curves.normalize(mean_G, mean_G[-1], offset)), float(mean_G[-1])


@dataclasses.dataclass(frozen=True)
class SurrogateInputs:
    """Finished runs prepared for the surrogate: normalized curves and schedules on one t̂ grid."""
    curves_CxG: np.ndarray
    frac_G: np.ndarray
    eta_CxG: np.ndarray
    eta_end_C: np.ndarray
    tau_C: np.ndarray
    tpp_C: np.ndarray
    info: list[dict]   # per curve: its source and controls

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The positional arguments of surrogate.fit_surrogate (after the constants, of mae_per_curve)."""
        return self.curves_CxG, self.frac_G, self.eta_CxG, self.eta_end_C, self.tau_C, self.tpp_C

    def take(self, index) -> "SurrogateInputs":
        """The curves at `index` (an index array or boolean mask)."""
        index = np.arange(len(self.info))[index]
        return SurrogateInputs(self.curves_CxG[index], self.frac_G, self.eta_CxG[index], self.eta_end_C[index],
                               self.tau_C[index], self.tpp_C[index], [self.info[i] for i in index])


def surrogate_inputs(runs: list[Curve], n_bins: int, smooth_bins: int) -> SurrogateInputs:
    """Normalizes finished runs and evaluates their schedules on the grid; ConfigError if a control is missing."""
    frac_G = curves.bin_centers(n_bins)
    curves_C, eta_C, eta_end_C = [], [], []
    for run in runs:
        c = run.controls
        missing = [n for n in ("tau", "tpp", "schedule") if getattr(c, n) is None]
        if missing:
            raise ConfigError(f"{run.source}: the surrogate needs the controls {missing}; add them to the "
                              "sidecar JSON or use a run directory")
        curves_C.append(normalize_run(run, n_bins, smooth_bins)[0])
        eta_G, eta_end = surrogate.schedule_on_grid(frac_G, c.schedule, c.warmup_frac or 0.0)
        eta_C.append(np.asarray(eta_G))
        eta_end_C.append(float(eta_end))
    return SurrogateInputs(np.stack(curves_C), np.asarray(frac_G), np.stack(eta_C), np.array(eta_end_C),
                           np.array([r.controls.tau for r in runs]), np.array([r.controls.tpp for r in runs]),
                           [{"curve": r.source, **r.controls.to_dict()} for r in runs])


def reference_from_curves(runs: list[Curve], n_bins: int, smooth_bins: int, offset: float = 0.0,
                          force: bool = False) -> Reference:
    """Seed-averaged normalized curve of finished runs of one size with the same controls."""
    for run in runs:
        differ = run.controls.mismatches(runs[0].controls)
        n0, n1 = runs[0].controls.n_params, run.controls.n_params
        if n0 and n1 and n0 != n1:
            differ.append(f"n_params {n1:.4g} vs {n0:.4g}")
        if differ and not force:
            raise ConfigError(f"{run.source}: controls differ from {runs[0].source} ({', '.join(differ)}); "
                              "a reference averages seeds of one size and recipe. Pass --force to mix them")
    normalized, finals = zip(*(normalize_run(run, n_bins, smooth_bins, offset) for run in runs))
    normalized_KxG = np.stack(normalized)
    provenance = {"kind": "curves", "sources": [r.source for r in runs], "n_seeds": len(runs),
                  "n_bins": n_bins, "smooth_bins": smooth_bins, "created": _now()}
    return Reference(curves.bin_centers(n_bins), normalized_KxG.mean(axis=0),
                     normalized_KxG.std(axis=0, ddof=1) if len(runs) > 1 else None, runs[0].controls,
                     float(offset), float(np.mean(finals)), provenance)


def reference_from_surrogate(constants: surrogate.SurrogateConstants, controls: Controls, n_bins: int,
                             source: str = "") -> Reference:
    """The surrogate's normalized curve for the given τ, TPP and schedule (warmup_frac default 0)."""
    missing = [n for n in ("tau", "tpp", "schedule") if getattr(controls, n) is None]
    if missing:
        raise ConfigError(f"the surrogate needs the controls {missing}; pass them (--tau, --tpp, --schedule)")
    frac_G = curves.bin_centers(n_bins)
    eta_G, eta_end = surrogate.schedule_on_grid(frac_G, controls.schedule, controls.warmup_frac or 0.0)
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


def _floats(x: np.ndarray) -> list[float]:
    return [float(f"{v:.7g}") for v in np.asarray(x, float)]


def save_reference(ref: Reference, path: str) -> None:
    data = {"format": FORMAT, "controls": ref.controls.to_dict(), "offset": ref.offset,
            "final_loss": ref.final_loss, "provenance": ref.provenance, "frac": _floats(ref.frac_G),
            "normalized_loss": _floats(ref.normalized_G)}
    if ref.seed_std_G is not None:
        data["seed_std"] = _floats(ref.seed_std_G)
    write_json_atomic(path, data)


def _float_array(data: dict, key: str, path: str, fix: str) -> np.ndarray:
    """data[key], a list of finite numbers, as an array; else a one-line ConfigError."""
    if key not in data:
        raise ConfigError(f"{path}: the reference has no {key!r}; {fix}")
    try:
        array = np.asarray(data[key], float)
    except (TypeError, ValueError, OverflowError):
        array = None
    if array is None or array.ndim != 1 or not np.all(np.isfinite(array)):
        raise ConfigError(f"{path}: {key!r} is not a list of finite numbers; {fix}")
    return array


def load_reference(path: str) -> Reference:
    """The reference JSON at `path`; a file that is not one, or is damaged, is a one-line ConfigError."""
    fix = "rebuild it with `celerity collapse reference`"
    data = read_json(path, FORMAT, "celerity collapse reference")
    frac_G = _float_array(data, "frac", path, fix)
    normalized_G = _float_array(data, "normalized_loss", path, fix)
    seed_std_G = _float_array(data, "seed_std", path, fix) if "seed_std" in data else None
    if (frac_G.size < 2 or np.any(np.diff(frac_G) <= 0) or normalized_G.shape != frac_G.shape
            or np.any(normalized_G <= 0) or (seed_std_G is not None and seed_std_G.shape != frac_G.shape)):
        raise ConfigError(f"{path}: 'frac' must increase and match 'normalized_loss' (positive) and 'seed_std' "
                          f"in length; {fix}")
    offset = data.get("offset", 0.0)
    # abs(offset) < 1e300 also refuses nan, inf and ints too large for a float
    if isinstance(offset, bool) or not isinstance(offset, int | float) or not abs(offset) < 1e300:
        raise ConfigError(f"{path}: 'offset' = {offset!r} is not a finite number; {fix}")
    controls, _ = controls_from_mapping(data.get("controls", {}), path, fix)
    return Reference(frac_G, normalized_G, seed_std_G, controls, float(offset), data.get("final_loss"),
                     data.get("provenance", {}), path)


def check_controls(refs: list[Reference], run: Controls, run_name: str, force: bool = False,
                   offset: float = 0.0) -> list[str]:
    """Refuses references whose TPP, τ, schedule or offset differ from the run's (or each other's).

    Returns notes on what could not be checked; with `force`, mismatches become notes too.
    """
    notes, problems = [], []
    for ref in refs:
        problems += [f"{ref.source}: {m} (reference vs run)" for m in ref.controls.mismatches(run)]
        problems += [f"{ref.source}: {m} (vs {refs[0].source})" for m in ref.controls.mismatches(refs[0].controls)]
        if abs(ref.offset - offset) > 1e-12:
            problems.append(f"{ref.source}: offset L0 {ref.offset:g} vs {offset:g}")
        unknown = ref.controls.unknown(run)
        if unknown:
            notes.append(f"{ref.source}: not checked against {run_name}: {', '.join(unknown)} unknown")
    if problems and not force:
        raise ConfigError(f"references do not match {run_name}: {'; '.join(problems)}. A normalized curve "
                          "depends on TPP, τ and the schedule; use references with the same controls, "
                          "or force it (--force; TrainConfig.force_reference when training)")
    return notes + [f"forced: {p}" for p in problems]


def reference_curve(refs: list[Reference], frac_G: np.ndarray, n_params: float | None = None) -> jnp.ndarray:
    """The references' normalized curve on `frac_G`: family-aware at N = `n_params` when they span
    several sizes (each with its N), else their geometric mean."""
    on_grid_KxG = jnp.stack([jnp.interp(jnp.asarray(frac_G, jnp.float32), r.frac_G, r.normalized_G)
                             for r in refs])
    sizes = [r.controls.n_params for r in refs]
    if n_params is None or None in sizes:
        sizes, n_params = [1.0] * len(refs), 1.0
    return family.family_curve(on_grid_KxG, jnp.asarray(sizes), n_params)
