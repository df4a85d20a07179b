"""The in-loop collapse monitor: a fixed-size binned loss curve on the device, and its metrics.

The state is the run's curve binned on `n_bins` equal bins of t̂ (per-bin loss sum and step count), so
it is small, checkpointable and exactly the object the offline tools build from curve.csv.
`monitor_update` runs inside the jitted train step; `monitor_metrics` runs at log steps against a
reference curve on the same grid (see `monitor_reference`).

Alert policy: at bin j the residual r_j = l_run − l_ref of the smoothed, normalized loss has noise
σ_j = l_ref·sqrt(σ²/n_j + δ²), from the per-step noise σ and the divisor's error δ that early-align
estimates on this run's own alignment window (n_j: steps in the smoothing window of bin j); σ_j is at
least `residual_floor`. `collapse/alert` is 1 when |r_j| > alert_k·σ_j at each of the last `alert_m`
bins up to the current one (a bin is 1/n_bins of training: a "log" of the policy is one bin, whatever
the logging interval). Metrics are NaN until the run has `min_align_span` of its alignment window.
"""

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from celerity_jax.collapse import curves
from celerity_jax.collapse.loading import Controls
from celerity_jax.collapse.reference import check_controls, load_reference, reference_curve
from celerity_jax.config_types import check_field_types
from celerity_jax.errors import ConfigError

METRICS = ("collapse/normalized_loss", "collapse/residual", "collapse/residual_sigma",
           "collapse/pred_final_loss", "collapse/pred_final_loss_err", "collapse/alert")


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    n_bins: int = 1000
    smooth_bins: int = 11               # odd; centered moving average over bins
    align_window: tuple[float, float] = (0.25, 0.5)  # t̂ range of early-align (the paper's 25–50%)
    min_align_span: float = 0.05        # predictions start at t̂ = align_window[0] + this
    offset: float = 0.0                 # L0 of (L − L0)/(L_T − L0); 0 = the paper's plain division
    alert_k: float = 4.0
    alert_m: int = 10
    residual_floor: float = 0.0         # least σ of the residual, in normalized-loss units
    stop_on_alert: bool = False         # read by the trainer: stop (with a checkpoint) on an alert

    def __post_init__(self):
        check_field_types(self)  # also makes align_window a pair: a tuple, hashable when gin gives a list
        lo, hi = self.align_window
        checks = [
            (self.n_bins >= 2, "n_bins must be >= 2"),
            (self.smooth_bins >= 1 and self.smooth_bins % 2 == 1 and self.smooth_bins < self.n_bins,
             "smooth_bins must be odd, >= 1 and < n_bins"),
            (0.0 <= lo < hi <= 1.0, "align_window must be (lo, hi) with 0 <= lo < hi <= 1"),
            (0.0 < self.min_align_span <= hi - lo, "min_align_span must be in (0, hi - lo]"),
            (self.offset >= 0.0, "offset must be >= 0"),
            (self.alert_k > 0.0, "alert_k must be > 0"),
            (self.alert_m >= 1, "alert_m must be >= 1"),
            (self.residual_floor >= 0.0, "residual_floor must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"MonitorConfig: {message} (got {self})")


def monitor_init(cfg: MonitorConfig) -> dict[str, jax.Array]:
    """An empty binned curve."""
    return {"loss_sum": jnp.zeros(cfg.n_bins, jnp.float32), "count": jnp.zeros(cfg.n_bins, jnp.float32)}


def monitor_update(state: dict[str, jax.Array], loss: jax.Array, frac: jax.Array) -> dict[str, jax.Array]:
    """Adds one step's loss at t̂ = `frac`: the binning of curves.bin_curve, one step at a time (jit-able;
    a non-finite loss is skipped)."""
    sum_G, count_G = curves.bin_curve(jnp.reshape(frac, (1,)), jnp.reshape(loss, (1,)),
                                      state["loss_sum"].shape[0])
    return {"loss_sum": state["loss_sum"] + sum_G, "count": state["count"] + count_G}


@functools.partial(jax.jit, static_argnames="cfg")
def monitor_metrics(state: dict[str, jax.Array], reference_G: jax.Array,
                    cfg: MonitorConfig) -> dict[str, jax.Array]:
    """The METRICS at the current (last filled) bin; `reference_G` on bin_centers(cfg.n_bins)."""
    sum_G, count_G = state["loss_sum"], state["count"]
    align = curves.early_align(sum_G, count_G, reference_G, cfg.align_window, cfg.offset)
    j = curves.last_bin(count_G)
    ready = ((j + 1) / cfg.n_bins >= cfg.align_window[0] + cfg.min_align_span) & jnp.isfinite(align.final)
    r_G, sigma_G, normalized_G = curves.residuals(sum_G, count_G, reference_G, align, cfg.smooth_bins,
                                                  cfg.offset)
    sigma_G = jnp.maximum(sigma_G, cfg.residual_floor)
    bins_G = jnp.arange(cfg.n_bins)
    recent_G = (bins_G > j - cfg.alert_m) & (bins_G <= j)
    exceed_G = jnp.abs(r_G) > cfg.alert_k * sigma_G
    alert = ready & (j >= cfg.alert_m - 1) & jnp.all(exceed_G | ~recent_G)
    values = (normalized_G[j], r_G[j], sigma_G[j], align.final, align.final_err)
    metrics = {name: jnp.where(ready, v, jnp.nan) for name, v in zip(METRICS, values)}
    metrics["collapse/alert"] = alert.astype(jnp.float32)
    return metrics


@functools.partial(jax.jit, static_argnames=("cfg", "log_every"))
def replay_monitor(frac_T: jax.Array, loss_T: jax.Array, reference_G: jax.Array, cfg: MonitorConfig,
                   log_every: int) -> dict[str, jax.Array]:
    """What the in-loop monitor would log every `log_every` steps (and at the last) of a recorded curve.

    Returns each metric as an array over the logs, and "frac": t̂ at each log. Memory: logs × n_bins.
    """
    n_steps = frac_T.shape[0]
    n_logs = -(-n_steps // log_every)
    segment_T = (jnp.arange(n_steps) // log_every) * cfg.n_bins + curves.bin_index(frac_T, cfg.n_bins)
    loss_T = jnp.asarray(loss_T, jnp.float32)
    ok_T = jnp.isfinite(loss_T)

    def cumulative(x_T):
        return jnp.cumsum(jax.ops.segment_sum(x_T, segment_T, n_logs * cfg.n_bins).reshape(
            n_logs, cfg.n_bins), axis=0)

    states = {"loss_sum": cumulative(jnp.where(ok_T, loss_T, 0.0)), "count": cumulative(ok_T.astype(jnp.float32))}
    logs = jax.vmap(lambda s: monitor_metrics(s, reference_G, cfg))(states)
    logs["frac"] = jnp.asarray(frac_T, jnp.float32)[
        jnp.minimum((jnp.arange(n_logs) + 1) * log_every, n_steps) - 1]
    return logs


def monitor_reference(paths: Sequence[str], cfg: MonitorConfig, controls: Controls, run_name: str = "the run",
                      force: bool = False) -> tuple[jax.Array, list[str]]:
    """Loads reference JSONs for a run and returns (reference_G on the monitor grid, notes).

    Refuses references whose TPP, τ, schedule or offset differ from `controls` unless `force`; with
    several sizes (and controls.n_params known) the curve is the family-aware one at the run's N.
    """
    if not paths:
        raise ConfigError("no reference given; build one with `celerity collapse reference`")
    refs = [load_reference(p) for p in paths]
    notes = check_controls(refs, controls, run_name, force, cfg.offset)
    if controls.n_params is None and len({r.controls.n_params for r in refs}) > 1:
        notes.append(f"N of {run_name} unknown: its reference is the mean over the references' sizes")
    frac_G = curves.bin_centers(cfg.n_bins)
    return reference_curve(refs, frac_G, controls.n_params), notes
