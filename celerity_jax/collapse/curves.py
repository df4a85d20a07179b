"""Loss curves on a fixed t̂ grid: binning, smoothing, normalization, early-align, residuals, quality.

A curve lives on `n_bins` equal bins of t̂ = step/T as per-bin loss sums and step counts. Partial
curves, runs shorter than the grid and the in-loop monitor's running state are then one object, and the
offline tools and the jitted monitor share every function here (pure jnp, jit-able), except the two
host-side ones: `normalize_run` (a finished run's normalized curve, with its input checks) and `loss_ema`
(the bias-corrected loss EMA of the trainer's `train/loss_smooth` and of the raw-loss detector).
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax.collapse.types import Curve
from celerity_jax.errors import ConfigError


def bin_centers(n_bins: int) -> np.ndarray:
    """t̂ at the middle of each of `n_bins` equal bins of [0, 1] (float64; a constant under jit)."""
    return (np.arange(n_bins) + 0.5) / n_bins


@functools.partial(jax.jit, static_argnames="n_bins")
def bin_index(frac: jax.Array, n_bins: int) -> jax.Array:
    """The bin of t̂ = `frac`; t̂ = 1 falls in the last bin."""
    return jnp.clip(jnp.floor(jnp.asarray(frac, jnp.float32) * n_bins).astype(jnp.int32), 0, n_bins - 1)


@functools.partial(jax.jit, static_argnames="n_bins")
def bin_curve(frac_T: jax.Array, loss_T: jax.Array, n_bins: int) -> tuple[jax.Array, jax.Array]:
    """Per-bin (loss sum, step count) of a curve; non-finite losses are skipped."""
    loss_T = jnp.asarray(loss_T, jnp.float32)
    ok_T = jnp.isfinite(loss_T)
    idx_T = bin_index(frac_T, n_bins)
    sum_G = jax.ops.segment_sum(jnp.where(ok_T, loss_T, 0.0), idx_T, n_bins)
    count_G = jax.ops.segment_sum(ok_T.astype(jnp.float32), idx_T, n_bins)
    return sum_G, count_G


@functools.partial(jax.jit, static_argnames="width")
def smooth(sum_G: jax.Array, count_G: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """Centered moving average over `width` (odd) bins, weighted by steps: (mean_G, steps_G).

    The mean over every step whose bin lies within width//2 bins; the window is one-sided at the ends
    (so the last bin of a partial curve uses only the past). NaN where the window holds no step.
    """
    def window_sum(x_G):  # a sum of shifted copies: fuses into one pass (reduce_window is slow on CPU)
        padded = jnp.pad(x_G, width // 2)
        return sum(padded[k:k + x_G.shape[0]] for k in range(width))
    steps_G, total_G = window_sum(count_G), window_sum(sum_G)
    mean_G = jnp.where(steps_G > 0, total_G / jnp.where(steps_G > 0, steps_G, 1.0), jnp.nan)
    return mean_G, steps_G


def normalize(loss: jax.Array, final: jax.Array, offset: float = 0.0) -> jax.Array:
    """l = (L − L0)/(L_T − L0); L0 = 0 is the paper's plain division, L0 > 0 Qiu et al.'s offset form."""
    return (loss - offset) / (final - offset)


def normalize_run(run: Curve, n_bins: int, smooth_bins: int, offset: float = 0.0) -> tuple[np.ndarray, float]:
    """(normalized curve on the grid, final smoothed loss) of a finished run: binned, smoothed and divided
    by its own final (last-bin, smoothed) loss; ConfigError for a partial run, a gap or a bad offset."""
    if not run.finished:
        raise ConfigError(f"{run.source}: the curve stops at step {int(run.step_T[-1])} of {run.total_steps}; "
                          "this needs finished runs (`collapse predict` takes partial ones)")
    if offset >= run.loss_T.min():
        raise ConfigError(f"{run.source}: offset L0 = {offset} is not below the loss "
                          f"(min {run.loss_T.min():.4g}); lower --offset")
    mean_G, _ = smooth(*bin_curve(run.frac_T, run.loss_T, n_bins), smooth_bins)
    if not bool(jnp.all(jnp.isfinite(mean_G))):
        raise ConfigError(f"{run.source}: {len(run.step_T)} points leave gaps on a {n_bins}-bin grid "
                          f"smoothed over {smooth_bins} bins; use fewer --bins or more --smooth-bins")
    return np.asarray(normalize(mean_G, mean_G[-1], offset)), float(mean_G[-1])


@jax.jit
def last_bin(count_G: jax.Array) -> jax.Array:
    """Index of the last bin holding a step (-1 for an empty curve)."""
    return jnp.max(jnp.where(count_G > 0, jnp.arange(count_G.shape[0]), -1))


class Alignment(NamedTuple):
    """Early-align result. Errors are 1σ from the residual noise alone (no model mismatch)."""
    final: jax.Array          # predicted final loss L_T = L0 + exp(log_scale)
    final_err: jax.Array
    log_scale: jax.Array      # log of the divisor L_T − L0
    log_scale_err: jax.Array
    noise: jax.Array          # per-step relative noise of the loss around the aligned reference


@jax.jit
def early_align(sum_G: jax.Array, count_G: jax.Array, ref_G: jax.Array,
                window: tuple[float, float], offset: float = 0.0) -> Alignment:
    """The divisor aligning a (partial) binned curve with a normalized reference over a t̂ window.

    Least squares in log space, closed form: y_i = log(L̄_i − L0) − log l_ref_i over the bins i in
    the window, weighted by their step counts c_i; log(L_T − L0) = Σ c_i y_i / Σ c_i. A bin mean of
    c_i steps has variance σ²/c_i, so σ² = Σ c_i e_i² / (n − 1) estimates the per-step noise from the
    residuals e_i, and σ/sqrt(Σ c_i) is the error of the log divisor. NaN when no bin is in the window.
    """
    n_bins = sum_G.shape[0]
    centers_G = bin_centers(n_bins)
    in_window_G = (centers_G >= window[0]) & (centers_G < window[1]) & (count_G > 0)
    weight_G = jnp.where(in_window_G, count_G, 0.0)
    mean_G = sum_G / jnp.where(count_G > 0, count_G, 1.0)
    y_G = jnp.where(in_window_G, jnp.log(jnp.where(in_window_G, mean_G - offset, 1.0))
                    - jnp.log(jnp.where(in_window_G, ref_G, 1.0)), 0.0)
    total = jnp.sum(weight_G)
    n_used = jnp.sum(in_window_G)
    log_scale = jnp.where(total > 0, jnp.sum(weight_G * y_G) / jnp.where(total > 0, total, 1.0), jnp.nan)
    err_G = jnp.where(in_window_G, y_G - log_scale, 0.0)
    noise = jnp.where(n_used > 1, jnp.sqrt(jnp.sum(weight_G * err_G**2) / jnp.maximum(n_used - 1, 1)),
                      jnp.nan)
    log_scale_err = noise / jnp.sqrt(total)
    scale = jnp.exp(log_scale)
    return Alignment(offset + scale, scale * log_scale_err, log_scale, log_scale_err, noise)


@functools.partial(jax.jit, static_argnames="width")
def residuals(sum_G: jax.Array, count_G: jax.Array, ref_G: jax.Array, align: Alignment, width: int,
              offset: float = 0.0) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(residual_G, sigma_G, normalized_G) of a binned curve against the reference it was aligned to.

    normalized = (smoothed L − L0)/exp(log_scale), residual r = normalized − l_ref, and sigma the
    noise of r expected from the alignment's per-step noise: l_ref·sqrt(σ²/steps_in_window + err²).
    """
    mean_G, steps_G = smooth(sum_G, count_G, width)
    normalized_G = (mean_G - offset) / jnp.exp(align.log_scale)
    sigma_G = ref_G * jnp.sqrt(align.noise**2 / steps_G + align.log_scale_err**2)
    return normalized_G - ref_G, sigma_G, normalized_G


@jax.jit
def family_curve(curves_KxG: jax.Array, n_params_K: jax.Array, n_target: float) -> jax.Array:
    """The normalized curve at N = `n_target`, from K references (normalized curves) with their N.

    Collapse is never perfect: normalized curves of a family drift slowly with N. This fits
    log l(t̂) = a(t̂) + b(t̂)·log N at every t̂ (least squares across the references) and evaluates it at
    `n_target`. Every reference is 1 at t̂ = 1, so the result is too. With references of a single size it
    is their geometric mean, i.e. single-reference alignment.
    """
    x_K = jnp.log(jnp.asarray(n_params_K, jnp.float32))
    y_KxG = jnp.log(jnp.asarray(curves_KxG, jnp.float32))
    dx_K = x_K - jnp.mean(x_K)
    var = jnp.sum(dx_K**2)
    slope_G = jnp.where(var > 0, dx_K @ (y_KxG - jnp.mean(y_KxG, axis=0)) / jnp.where(var > 0, var, 1.0),
                        0.0)
    return jnp.exp(jnp.mean(y_KxG, axis=0) + slope_G * (jnp.log(n_target) - jnp.mean(x_K)))


def _in_range(frac_G: jax.Array, lo: float, hi: float) -> jax.Array:
    return (frac_G >= lo) & (frac_G <= hi)


@jax.jit
def collapse_quality(curves_KxG: jax.Array, frac_G: jax.Array, lo: float = 0.2,
                     hi: float = 1.0) -> dict[str, jax.Array]:
    """Spread of a family's normalized curves over t̂ ∈ [lo, hi], averaged over t̂.

    mean_abs_dev: mean |l_k − mean_k l_k| (the headline number); mean_range / max_range: the mean and
    the largest max−min across curves.
    """
    keep_G = _in_range(frac_G, lo, hi)
    dev_KxG = jnp.abs(curves_KxG - jnp.mean(curves_KxG, axis=0))
    range_G = jnp.max(curves_KxG, axis=0) - jnp.min(curves_KxG, axis=0)
    return {
        "mean_abs_dev": jnp.sum(jnp.mean(dev_KxG, axis=0) * keep_G) / jnp.sum(keep_G),
        "mean_range": jnp.sum(range_G * keep_G) / jnp.sum(keep_G),
        "max_range": jnp.max(jnp.where(keep_G, range_G, -jnp.inf)),
    }


@jax.jit
def supercollapse(curves_KxRxG: jax.Array, frac_G: jax.Array, lo: float = 0.2,
                  hi: float = 1.0) -> dict[str, jax.Array]:
    """Qiu et al.'s test: spread across sizes Δ against seed-to-seed noise σ, over t̂ ∈ [lo, hi].

    K sizes × R seeds (NaN rows for missing seeds). Δ(t̂) = std over sizes of the seed-mean curves;
    σ(t̂) = sqrt(mean over sizes of the seed variance). Supercollapse: Δ < σ. Returns the t̂-means of
    Δ and σ, their ratio and the fraction of t̂ where Δ < σ.
    """
    keep_G = _in_range(frac_G, lo, hi)
    mean_KxG = jnp.nanmean(curves_KxRxG, axis=1)
    delta_G = jnp.std(mean_KxG, axis=0)
    sigma_G = jnp.sqrt(jnp.nanmean(jnp.nanvar(curves_KxRxG, axis=1, ddof=1), axis=0))
    delta = jnp.sum(delta_G * keep_G) / jnp.sum(keep_G)
    sigma = jnp.sum(sigma_G * keep_G) / jnp.sum(keep_G)
    return {"delta": delta, "sigma": sigma, "ratio": delta / sigma,
            "frac_below": jnp.sum((delta_G < sigma_G) * keep_G) / jnp.sum(keep_G)}


def supercollapse_floor(seeds_K) -> float:
    """The root-mean-square Δ/σ of a family with no size effect (to first order): √((K−1)/K · mean_k 1/R_k) for K
    sizes with R_k seeds, since each seed mean then scatters by σ/√R_k; √((K−1)/(K·R)) at R seeds each. The mean
    Δ/σ of such a family sits somewhat below it (Δ is a standard deviation, not its square)."""
    seeds_K = np.asarray(seeds_K, float)
    k = len(seeds_K)
    return float(np.sqrt((k - 1) / k * np.mean(1.0 / seeds_K)))


def family_measures(curves_KxRxG: np.ndarray, n_params_K, frac_G: np.ndarray, lo: float = 0.2,
                    hi: float = 1.0) -> dict:
    """How a family's normalized curves depend on size, against seed noise, over t̂ ∈ [lo, hi].

    K sizes × R seeds (NaN rows for missing seeds), at least two sizes and one size with two seeds. ℓ̄ is a
    curve's mean over the range.
    - trend: the least-squares slope of the seed-mean ℓ̄ against ln N (`trend_slope`), its standard error from
      the seed scatter of ℓ̄ (`trend_se`), and their ratio (`trend`). A family that drifts steadily with N has a
      large |trend| even where Δ/σ, blind to order, is small.
    - `delta_over_sigma` (`supercollapse`), with `floor` (`supercollapse_floor`) beside it;
    - `mae_by_size`: the paper's metric, mean |ℓ_k − family mean| of each size's seed-mean curve; `mae` their
      mean (`collapse_quality`'s mean_abs_dev over the seed means).
    """
    keep_G = (frac_G >= lo) & (frac_G <= hi)
    valid_KxR = np.all(np.isfinite(np.asarray(curves_KxRxG, float)[:, :, keep_G]), axis=2)
    curves_KxRxG = np.where(valid_KxR[:, :, None], curves_KxRxG, np.nan)  # a seed counts only whole over the range
    seeds_K = valid_KxR.sum(axis=1)
    if len(n_params_K) != len(seeds_K):
        raise ConfigError(f"{len(n_params_K)} parameter counts for {len(seeds_K)} sizes; give one N per size")
    if len(seeds_K) < 2 or seeds_K.min() < 1 or seeds_K.max() < 2:
        raise ConfigError(f"a family's measures need two sizes or more, each with a curve, and a size with two seeds "
                          f"(seeds by size: {seeds_K.tolist()})")
    mean_KxR = np.full(valid_KxR.shape, np.nan)
    mean_KxR[valid_KxR] = curves_KxRxG[valid_KxR][:, keep_G].mean(axis=1)
    mean_K = np.nanmean(mean_KxR, axis=1)
    seed_var = np.nanmean([np.nanvar(row, ddof=1) for row, r in zip(mean_KxR, seeds_K) if r > 1])
    x_K = np.log(np.asarray(n_params_K, float))
    dx_K = x_K - x_K.mean()
    sxx = float(np.sum(dx_K**2))
    if sxx == 0:
        raise ConfigError("a family's sizes all have the same N; the trend needs sizes that differ")
    slope = float(dx_K @ (mean_K - mean_K.mean()) / sxx)
    se = float(np.sqrt(np.sum(dx_K**2 * seed_var / seeds_K)) / sxx)
    seed_mean_KxG = np.nanmean(curves_KxRxG, axis=1)
    mae_K = np.abs(seed_mean_KxG - seed_mean_KxG.mean(axis=0))[:, keep_G].mean(axis=1)
    super_ = {k: float(v) for k, v in supercollapse(curves_KxRxG, frac_G, lo, hi).items()}
    trend = slope / se if se > 0 else (0.0 if slope == 0 else float("inf") * np.sign(slope))
    return {"trend_slope": slope, "trend_se": se, "trend": trend,
            "delta": super_["delta"], "sigma": super_["sigma"], "delta_over_sigma": super_["ratio"],
            "floor": supercollapse_floor(seeds_K), "mae_by_size": [float(m) for m in mae_K], "mae": float(mae_K.mean()),
            "seeds": [int(r) for r in seeds_K]}


def loss_ema(loss_T, decay: float, carry: tuple[float, float] = (0.0, 0.0)) -> tuple[np.ndarray, tuple[float, float]]:
    """Bias-corrected exponential moving average of the finite losses: (ema_T, carry).

    value ← decay·value + (1 − decay)·loss and weight ← decay·weight + (1 − decay) at each finite loss (a
    non-finite one leaves both unchanged); ema = value/weight, NaN before the first finite loss. `carry` is
    (value, weight): pass the returned one to continue over the next chunk of losses. Host-side float64 (a
    Python loop), so that a chunk of any length costs no compile: the trainer calls it once per log interval.
    """
    value, weight = carry
    ema_T = np.empty(len(loss_T))
    for i, loss in enumerate(np.asarray(loss_T, np.float64).tolist()):
        if math.isfinite(loss):
            weight = decay * weight + (1 - decay)
            value = decay * value + (1 - decay) * loss
        ema_T[i] = value / weight if weight else math.nan
    return ema_T, (value, weight)
