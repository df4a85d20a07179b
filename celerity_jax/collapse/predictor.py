"""Final-loss prediction: the one home of "predict this run's final loss from its curve so far".

A prediction aligns the run's binned curve with a reference normalized curve over a t̂ window (early-align,
curves.early_align): the divisor is the predicted final loss, with its 1σ error from the residual noise.
The reference comes from one of two METHODS (`reference_for`): "nearest", the reference nearest the run in
log N, or "family", the family-aware curve of references of several sizes at the run's N
(curves.family_curve). The window (`window_at`) is a fixed t̂ range, or, without one, [a·f, f] at the seen
fraction f. A prediction is made once the run has passed the window's start
plus `min_span`.

Every user of prediction calls this module: the in-loop monitor's collapse/pred_final_loss
(`predict_binned`, under jit), and `celerity collapse predict`, the sweep and
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

METHODS = ("nearest", "family")


@dataclasses.dataclass(frozen=True)
class Prediction:
    final: float                   # predicted final loss
    err: float                     # its 1σ error from the residual noise (no model mismatch)
    seen: float                    # t̂ of the curve it was made from
    window: tuple[float, float]    # the t̂ window aligned over


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


def reference_for(refs: Sequence[Reference], frac_G: np.ndarray, n_params: float | None,
                  method: str) -> jax.Array:
    """The reference curve of `method` on `frac_G` for a run of N = `n_params` ("family" is the geometric mean
    of the references when N is unknown)."""
    if method not in METHODS:
        raise ConfigError(f"prediction method {method!r} is unknown; use one of {', '.join(METHODS)}")
    if method == "nearest":
        refs = [reference.nearest(refs, n_params)] if n_params else refs[:1]
    return reference.reference_curve(list(refs), frac_G, n_params)


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
