"""A raw-loss anomaly detector: the usual practice that the collapse alert is measured against.

It watches the training loss alone, with no reference curve: s_t is the bias-corrected EMA of the
per-step loss (curves.loss_ema, the trainer's `train/loss_smooth`, with its own decay), and

    z_t = (s_t − mean(s_{t−W}, …, s_{t−1})) / std(s_{t−W}, …, s_{t−1})      (sample std, t ≥ W)

is how far the smoothed loss sits above its own recent past. The alert holds at step t when z > k at
each of the m steps up to t. One-sided: a loss falling faster than before is no alarm. The z-score and
the alert are pure jnp (jit-able); the EMA is computed on the host.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from celerity_jax.collapse import curves
from celerity_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ZScoreConfig:
    """Defaults chosen once, on synthetic noisy power-law curves with 3–5% per-step noise
    (tests/test_collapse_detectors.py). A smoother EMA (e.g. the trainer's 0.98) turns a jump into a
    ramp that the window's own spread absorbs, so that z seldom passes k."""
    ema_decay: float = 0.9    # s_t: an EMA over about 10 steps
    window: int = 50          # W, steps of the past the z-score compares with
    k: float = 3.0            # threshold on z
    m: int = 5                # consecutive steps above k before the alert

    def __post_init__(self):
        checks = [(0.0 <= self.ema_decay < 1.0, "ema_decay must be in [0, 1)"),
                  (self.window >= 2, "window must be >= 2 steps"), (self.k > 0, "k must be > 0"),
                  (self.m >= 1, "m must be >= 1")]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"ZScoreConfig: {message} (got {self})")


@functools.partial(jax.jit, static_argnames="window")
def rolling_zscore(s_T: jax.Array, window: int) -> jax.Array:
    """z_t of s_t against the `window` values before it; NaN for t < window or a zero spread."""
    n = s_T.shape[0]
    t_T = jnp.arange(n)
    past_TxW = s_T[jnp.clip(t_T[:, None] - window + jnp.arange(window)[None, :], 0, n - 1)]
    mean_T = jnp.mean(past_TxW, axis=1)
    std_T = jnp.std(past_TxW, axis=1, ddof=1)
    z_T = (s_T - mean_T) / jnp.where(std_T > 0, std_T, 1.0)
    return jnp.where((t_T >= window) & (std_T > 0), z_T, jnp.nan)


@functools.partial(jax.jit, static_argnames="m")
def sustained(exceed_T: jax.Array, m: int) -> jax.Array:
    """True at t when `exceed_T` holds at each of the m steps up to t."""
    t_T = jnp.arange(exceed_T.shape[0])
    last_miss_T = jax.lax.cummax(jnp.where(exceed_T, -1, t_T))
    return t_T - last_miss_T >= m


def zscore_detector(loss_T: jax.Array, cfg: ZScoreConfig) -> dict[str, jax.Array]:
    """Per step: the smoothed loss, its z-score and the alert (bool)."""
    smooth_T = jnp.asarray(curves.loss_ema(loss_T, cfg.ema_decay)[0], jnp.float32)
    z_T = rolling_zscore(smooth_T, cfg.window)
    return {"smooth": smooth_T, "z": z_T, "alert": sustained(z_T > cfg.k, cfg.m)}


def first_true(flags) -> int:
    """Index of the first True, or -1."""
    flags = jnp.asarray(flags, bool)
    return int(jnp.argmax(flags)) if bool(jnp.any(flags)) else -1
