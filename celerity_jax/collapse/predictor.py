"""Final-loss prediction: the one home of "predict this run's final loss from its curve so far".

A prediction aligns the run's binned curve with a reference normalized curve over a t̂ window (early-align,
curves.early_align): the divisor is the predicted final loss, with its 1σ error from the residual noise.
The reference comes from one of three METHODS (`reference_for`): "nearest", the references of the size nearest
the run in log N (plain alignment, the paper's way); "family", the family-aware curve of references of several
sizes at the run's N (curves.family_curve); "shrunk", the family-aware curve with each t̂'s slope in log N shrunk
toward 0 by its signal-to-noise (`shrunk_family_curve`). The window (`window_at`) is a fixed t̂ range, or,
without one, [a·f, f] at the seen fraction f. A prediction is made once the run has passed the window's start
plus `min_span`.

Which method: `method_for` takes a named one, or with "auto" asks `choose_method`, which scores every method
the references allow by leave-one-size-out on those references alone (never on the run) at the fraction being
predicted, and keeps "nearest" unless another beats it by more than the noise of that score; a sweep, which
ranks settings against each other, chooses one method for all of them (`choose_method_across`). Each `Choice`
carries a one-line reason that the callers show.

Every user of prediction calls this module: the in-loop monitor's collapse/pred_final_loss
(`predict_binned`, under jit, its method chosen once at setup), and `celerity collapse predict`, the sweep and
benchmarks/collapse_predictor.py (`predict`).
"""

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax.collapse import curves, reference
from celerity_jax.collapse.types import Curve, Reference
from celerity_jax.errors import ConfigError

METHODS = ("nearest", "family", "shrunk")
SIZES_NEEDED = {"nearest": 1, "family": 2, "shrunk": 3}  # distinct reference sizes (N known) a method needs
NOISE_SE = 2.0  # standard errors by which a method's leave-one-size-out gain over "nearest" must exceed 0


@dataclasses.dataclass(frozen=True)
class Prediction:
    final: float                   # predicted final loss
    err: float                     # its 1σ error from the residual noise (no model mismatch)
    seen: float                    # t̂ of the curve it was made from
    window: tuple[float, float]    # the t̂ window aligned over


@dataclasses.dataclass(frozen=True)
class Choice:
    method: str                # one of METHODS
    scores: dict[str, float]   # method -> leave-one-size-out mean |predicted / final − 1|; only the scored ones
    reason: str                # one plain line


def window_at(seen: float, window: tuple[float, float] | None = None,
              align_start: float = 0.5) -> tuple[float, float]:
    """The alignment window at seen fraction `seen`: `window` as given (its bins not yet seen are empty), or
    [align_start·seen, seen]."""
    return (align_start * seen, seen) if window is None else tuple(window)


@jax.jit
def predict_binned(sum_G: jax.Array, count_G: jax.Array, reference_G: jax.Array, window: tuple[float, float],
                   offset: float = 0.0, min_span: float = 0.0) -> tuple[curves.Alignment, jax.Array]:
    """(early-align of a binned curve over `window`, ready): ready once the curve's last bin reaches
    window[0] + `min_span` and the alignment is finite (the monitor's metrics are NaN until then)."""
    align = curves.early_align(sum_G, count_G, reference_G, window, offset)
    seen = (curves.last_bin(count_G) + 1) / sum_G.shape[0]
    return align, (seen >= window[0] + min_span) & jnp.isfinite(align.final)


def _sizes(refs: Sequence[Reference]) -> list[float]:
    """The references' distinct N, smallest first; none when any N is unknown."""
    sizes = {r.controls.n_params for r in refs}
    return [] if None in sizes else sorted(sizes)


def available(refs: Sequence[Reference]) -> list[str]:
    """The METHODS that references of these sizes allow: "nearest" always, "family" from 2 sizes, "shrunk" from 3."""
    return [m for m in METHODS if SIZES_NEEDED[m] <= max(len(_sizes(refs)), 1)]


def shrunk_family_curve(curves_KxG: np.ndarray, n_params_K: np.ndarray, n_target: float) -> np.ndarray:
    """curves.family_curve with the slope b(t̂) of log l in log N multiplied by b²/(b² + se²), the signal-to-noise
    weight of its estimate (se² from the line's residuals over K − 2 degrees of freedom): a slope the references
    do not resolve is pulled toward 0, i.e. toward their geometric mean. Needs 3 references or more."""
    log_l_KxG = np.log(np.asarray(curves_KxG, np.float64))
    x_K = np.log(np.asarray(n_params_K, np.float64))
    dx_K, mean_G = x_K - x_K.mean(), log_l_KxG.mean(axis=0)
    slope_G = dx_K @ (log_l_KxG - mean_G) / (dx_K @ dx_K)
    residual_KxG = log_l_KxG - mean_G - np.outer(dx_K, slope_G)
    se2_G = (residual_KxG**2).sum(axis=0) / (len(x_K) - 2) / (dx_K @ dx_K)
    weight_G = np.where(slope_G**2 + se2_G > 0, slope_G**2 / np.maximum(slope_G**2 + se2_G, 1e-30), 1.0)
    return np.exp(mean_G + weight_G * slope_G * (math.log(n_target) - x_K.mean()))


def reference_for(refs: Sequence[Reference], frac_G: np.ndarray, n_params: float | None,
                  method: str) -> jax.Array:
    """The reference curve of `method` on `frac_G` for a run of N = `n_params`: "nearest" the geometric mean of
    the references of the nearest size (the first reference when N is unknown); "family" the family-aware curve
    (the geometric mean of all when N is unknown); "shrunk" (3 sizes or more, N known) its shrunk form."""
    if method not in METHODS:
        raise ConfigError(f"prediction method {method!r} is unknown; use one of {', '.join(METHODS)}")
    if method == "shrunk":
        if n_params is None or len(_sizes(refs)) < SIZES_NEEDED["shrunk"]:
            raise ConfigError(f"the shrunk method needs the run's N and references of 3 sizes or more (sizes "
                              f"{_sizes(refs) or 'unknown'}); add reference sizes or use nearest or family")
        on_grid_KxG = np.stack([np.interp(frac_G, r.frac_G, r.normalized_G) for r in refs])
        return jnp.asarray(shrunk_family_curve(on_grid_KxG, [r.controls.n_params for r in refs], n_params),
                           jnp.float32)
    if method == "nearest":
        if n_params:
            size = reference.nearest(refs, n_params).controls.n_params
            refs = [r for r in refs if r.controls.n_params == size]
        else:
            refs = refs[:1]
    return reference.reference_curve(list(refs), frac_G, n_params)


def _held_out_error(ref: Reference, ref_G: jax.Array, frac_G: np.ndarray, seen: float,
                    window: tuple[float, float], offset: float) -> float:
    """predicted / final − 1 for the loss curve of `ref` on `frac_G` cut at t̂ = `seen`, aligned with `ref_G`."""
    # A surrogate reference has no loss; with L0 = 0 (its only offset) the relative error does not depend on it.
    final = ref.final_loss if ref.final_loss is not None else 1.0
    loss_G = offset + np.interp(frac_G, ref.frac_G, ref.normalized_G) * (final - offset)
    count_G = (frac_G <= seen + 1e-9).astype(np.float32)
    align, _ = predict_binned(jnp.asarray(loss_G * count_G, jnp.float32), count_G, ref_G, window, offset)
    return float(align.final) / final - 1.0


def choose_method(refs: Sequence[Reference], frac_G: np.ndarray, seen: float,
                  window: tuple[float, float] | None = None, align_start: float = 0.5, offset: float = 0.0) -> Choice:
    """The method to predict with at seen fraction `seen`, chosen by leave-one-size-out on the references alone.

    Each size k in turn is held out: its loss curve on `frac_G` (normalized curve × final loss, or
    L0 + normalized·(final − L0) with an offset) is cut at `seen` and its final loss predicted from the other
    sizes by every method they allow, over window_at(seen, window, align_start). A method's score is the mean
    |predicted / final − 1| over the held-out sizes; one the remaining sizes cannot serve (family below 2, shrunk
    below 3) is not a candidate. The lowest score wins, but "nearest" (plain alignment) is kept unless the winner's
    gain, the mean over held-out sizes of |e_nearest| − |e_winner|, exceeds NOISE_SE standard errors of that
    paired difference. With one size (or an unknown N), or too few sizes to score another method, it is "nearest".
    """
    return choose_method_across([refs], frac_G, seen, window, align_start, offset)


def choose_method_across(families: Sequence[Sequence[Reference]], frac_G: np.ndarray, seen: float,
                         window: tuple[float, float] | None = None, align_start: float = 0.5,
                         offset: float = 0.0) -> Choice:
    """`choose_method` for several reference families at once, e.g. one per setting of a sweep, which must rank its
    settings by one method: predictions by different methods carry different biases, so a ranking across methods
    compares the biases. The sizes every family has are held out in turn; scores are the mean over every family and
    held-out size, and the noise test pairs the gains per size averaged over the families (the families, trained
    alike, are not independent draws)."""
    sizes = sorted(set.intersection(*(set(_sizes(refs)) for refs in families)))  # held out in every family
    if len(sizes) < 2:
        unknown = any(r.controls.n_params is None for refs in families for r in refs)
        why = ("N unknown" if unknown else "one size" if len(families) == 1 else
               "fewer than two sizes in common")
        return Choice("nearest", {}, f"nearest: the references have {why}, so there is no other method to choose")
    span = window_at(seen, window, align_start)
    fewest = min(len(_sizes(refs)) for refs in families)
    errors = {m: [[] for _ in sizes] for m in METHODS if SIZES_NEEDED[m] <= fewest - 1}  # [size][family]
    for refs in families:
        for k, n in enumerate(sizes):
            held = [r for r in refs if r.controls.n_params == n]
            others = [r for r in refs if r.controls.n_params != n]
            for method in errors:
                ref_G = reference_for(others, frac_G, n, method)
                errors[method][k].append(float(np.mean([_held_out_error(r, ref_G, frac_G, seen, span, offset)
                                                        for r in held])))
    at = f"at t̂ {seen:.3g}"
    abs_KxF = {m: np.abs(np.array(e)) for m, e in errors.items()}
    scores = {m: float(a.mean()) for m, a in abs_KxF.items() if np.all(np.isfinite(a))}
    if "nearest" not in scores:
        return Choice("nearest", {}, f"nearest: {at} no size could be predicted (the window [{span[0]:.3g}, "
                                     f"{span[1]:.3g}] holds no bin seen), so no method could be scored")
    best = min(scores, key=scores.get)
    over = f"{len(sizes)} sizes" + (f", {len(families)} families" if len(families) > 1 else "")
    if len(scores) == 1:
        return Choice("nearest", scores, f"nearest: with {fewest} sizes leave-one-size-out can score no other "
                                         f"method (family needs 3 sizes, shrunk 4); its error {at} "
                                         f"{100 * scores['nearest']:.2f}%")
    against = ", ".join(f"{m} {100 * s:.2f}%" for m, s in scores.items() if m != best)
    line = f"leave-one-size-out error {at} {100 * scores[best]:.2f}% against {against} ({over})"
    if best == "nearest":
        return Choice("nearest", scores, f"nearest: {line}")
    gain_K = (abs_KxF["nearest"] - abs_KxF[best]).mean(axis=1)
    se = float(np.std(gain_K, ddof=1) / math.sqrt(len(gain_K)))
    if gain_K.mean() > NOISE_SE * se:
        return Choice(best, scores, f"{best}: {line}")
    return Choice("nearest", scores, f"nearest: {best}'s {line}, but its gain {100 * gain_K.mean():.2f}% is "
                                     f"within {NOISE_SE:g} standard errors ({100 * se:.2f}%) across sizes")


def method_for(method: str, refs: Sequence[Reference], frac_G: np.ndarray, n_params: float | None, seen: float,
               window: tuple[float, float] | None = None, align_start: float = 0.5, offset: float = 0.0) -> Choice:
    """The method a caller predicts a run of N = `n_params` with: "auto" is `choose_method`'s choice; a named
    method is taken as asked, or "nearest" when the references have too few sizes for it. When the run's N is
    unknown and the references span sizes, anything but "nearest" is "family", their geometric mean. The reason
    says which and why."""
    if method not in ("auto", *METHODS):
        raise ConfigError(f"prediction method {method!r} is unknown; use one of auto, {', '.join(METHODS)}")
    if n_params is None and len(_sizes(refs)) > 1 and method != "nearest":
        asked = "" if method in ("auto", "family") else f"{method} was asked for, but "
        return Choice("family", {}, f"family: {asked}the run's N is unknown, so its reference is the references' "
                                    "geometric mean")
    if method == "auto":
        return choose_method(refs, frac_G, seen, window, align_start, offset)
    if method not in available(refs):
        return Choice("nearest", {}, f"nearest: {method} was asked for, but it needs references of "
                                     f"{SIZES_NEEDED[method]} sizes or more ({len(_sizes(refs)) or 'N unknown'})")
    return Choice(method, {}, f"{method}: as asked")


def predict(curve: Curve, reference_G: jax.Array, upto: float | None = None,
            window: tuple[float, float] | None = None, align_start: float = 0.5, offset: float = 0.0,
            min_span: float = 0.0) -> Prediction | None:
    """The final loss of `curve` predicted from its steps up to t̂ = `upto` (all by default), aligned with
    `reference_G` (on bin_centers of its length) over window_at(seen, window, align_start); None when the curve
    has not reached `upto` or has not passed the window's start plus `min_span`."""
    if upto is None:
        seen_T = np.ones(len(curve.step_T), bool)
        seen = float(curve.frac_T[-1])
    else:
        if curve.step_T[-1] < math.floor(upto * curve.total_steps + 1e-9):
            return None
        seen_T, seen = curve.frac_T <= upto + 1e-9, upto
    span = window_at(seen, window, align_start)
    binned = curves.bin_curve(curve.frac_T[seen_T], curve.loss_T[seen_T], reference_G.shape[0])
    align, ready = predict_binned(*binned, reference_G, span, offset, min_span)
    if not bool(ready):
        return None
    return Prediction(float(align.final), float(align.final_err), seen, span)
