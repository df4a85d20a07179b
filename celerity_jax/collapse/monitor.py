"""The in-loop collapse monitor: a fixed-size binned loss curve on the device, and its metrics (jit only).

The state is the run's curve binned on `n_bins` equal bins of t̂ (per-bin loss sum and step count), so
it is small, checkpointable and exactly the object the offline tools build from curve.csv.
`monitor_update` runs inside the jitted train step (or, with MonitorConfig.loss_curve 'eval', after each
eval); `monitor_metrics` runs at log steps against a reference curve on the same grid (made once at setup by
the method predictor.method_for chooses), with the alert policy that config.MonitorConfig describes; `monitor_curve`
gives the aligned curve that the trainer's figure draws (image.py); `replay_monitor` computes what it would
have logged from a recorded curve.
"""

import functools

import jax
import jax.numpy as jnp

from celerity_jax.collapse import curves, predictor
from celerity_jax.collapse.config import MonitorConfig

METRICS = ("collapse/normalized_loss", "collapse/residual", "collapse/residual_sigma",
           "collapse/pred_final_loss", "collapse/pred_final_loss_err", "collapse/alert")


def monitor_init(cfg: MonitorConfig) -> dict[str, jax.Array]:
    """An empty binned curve."""
    return {"loss_sum": jnp.zeros(cfg.n_bins, jnp.float32), "count": jnp.zeros(cfg.n_bins, jnp.float32)}


@jax.jit
def monitor_update(state: dict[str, jax.Array], loss: jax.Array, frac: jax.Array) -> dict[str, jax.Array]:
    """Adds one step's loss at t̂ = `frac`: the binning of curves.bin_curve, one step at a time (jitted;
    a non-finite loss is skipped)."""
    sum_G, count_G = curves.bin_curve(jnp.reshape(frac, (1,)), jnp.reshape(loss, (1,)),
                                      state["loss_sum"].shape[0])
    return {"loss_sum": state["loss_sum"] + sum_G, "count": state["count"] + count_G}


def _aligned(state: dict[str, jax.Array], reference_G: jax.Array, cfg: MonitorConfig):
    """(alignment, residual_G, sigma_G, normalized_G, current bin j, ready): ready once predictions start."""
    sum_G, count_G = state["loss_sum"], state["count"]
    align, ready = predictor.predict_binned(sum_G, count_G, reference_G, cfg.align_window, cfg.offset,
                                            cfg.min_align_span)
    j = curves.last_bin(count_G)
    r_G, sigma_G, normalized_G = curves.residuals(sum_G, count_G, reference_G, align, cfg.smooth_bins,
                                                  cfg.offset)
    return align, r_G, sigma_G, normalized_G, j, ready


@functools.partial(jax.jit, static_argnames="cfg")
def monitor_metrics(state: dict[str, jax.Array], reference_G: jax.Array,
                    cfg: MonitorConfig) -> dict[str, jax.Array]:
    """The METRICS at the current (last filled) bin; `reference_G` on bin_centers(cfg.n_bins)."""
    align, r_G, sigma_G, normalized_G, j, ready = _aligned(state, reference_G, cfg)
    sigma_G = jnp.maximum(sigma_G, cfg.residual_floor)
    bins_G = jnp.arange(cfg.n_bins)
    recent_G = (bins_G > j - cfg.alert_m) & (bins_G <= j)
    exceed_G = jnp.abs(r_G) > cfg.alert_k * sigma_G
    alert = ready & (j >= cfg.alert_m - 1) & jnp.all(exceed_G | ~recent_G)
    predicted = {"collapse/normalized_loss": normalized_G[j], "collapse/residual": r_G[j],
                 "collapse/residual_sigma": sigma_G[j], "collapse/pred_final_loss": align.final,
                 "collapse/pred_final_loss_err": align.final_err}
    return {**{name: jnp.where(ready, v, jnp.nan) for name, v in predicted.items()},
            "collapse/alert": alert.astype(jnp.float32)}


@functools.partial(jax.jit, static_argnames="cfg")
def monitor_curve(state: dict[str, jax.Array], reference_G: jax.Array, cfg: MonitorConfig) -> jax.Array:
    """The run's normalized curve so far on bin_centers(cfg.n_bins), as monitor_metrics aligns it (the smoothed
    curve divided by the predicted final loss); NaN past the current bin and before predictions start."""
    _, _, _, normalized_G, j, ready = _aligned(state, reference_G, cfg)
    return jnp.where(ready & (jnp.arange(cfg.n_bins) <= j), normalized_G, jnp.nan)


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
