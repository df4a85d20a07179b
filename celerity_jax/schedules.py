"""Learning-rate schedules (peak 1) and the Straight-to-Zero EMA view of AdamW.

Each schedule is one shape of t̂ = t/T in [0, 1]: a linear warmup over the first `warmup_frac`, then
the schedule's decay. `normalized` is that shape (used by the collapse surrogate); `make_schedule`
evaluates it at t̂ = step/T, with `step` the number of updates already applied (optax's count), so a
warmup's first update has LR 0 and "d2z" reaches exactly 0 at the end of training.
"""

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp

from celerity_jax.errors import ConfigError

# d2z: linear decay to zero. linear_10x: linear decay to 10% of peak. wsd: warmup-stable-decay, the
# final `wsd_decay_frac` of training decaying linearly to zero.
SCHEDULES = ("d2z", "constant", "cosine", "linear_10x", "wsd")


def check_schedule(name: str, warmup_frac: float, wsd_decay_frac: float = 0.2) -> None:
    """Raises ConfigError unless the schedule name and fractions describe a schedule."""
    if name not in SCHEDULES:
        raise ConfigError(f"schedule = {name!r} is unknown; use one of {', '.join(SCHEDULES)}")
    if not 0.0 <= warmup_frac < 1.0:
        raise ConfigError(f"warmup_frac = {warmup_frac:.3g} must be in [0, 1): the warmup must be "
                          "shorter than training; shorten the warmup or train longer")
    if name == "wsd" and not 0.0 < wsd_decay_frac <= 1.0 - warmup_frac:
        raise ConfigError(f"wsd_decay_frac = {wsd_decay_frac:g} must be in (0, 1 - warmup_frac = "
                          f"{1.0 - warmup_frac:.3g}]: the decay phase cannot overlap the warmup")


def normalized(name: str, frac: jax.Array | float, warmup_frac: float = 0.0,
               wsd_decay_frac: float = 0.2) -> jax.Array:
    """The schedule with peak 1 as a function of t̂ = `frac` in [0, 1] (array-friendly, jit-able)."""
    check_schedule(name, warmup_frac, wsd_decay_frac)
    frac = jnp.asarray(frac, jnp.float32)
    progress = jnp.clip((frac - warmup_frac) / (1.0 - warmup_frac), 0.0, 1.0)
    if name == "d2z":
        decayed = 1.0 - progress
    elif name == "constant":
        decayed = jnp.ones_like(frac)
    elif name == "cosine":
        decayed = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    elif name == "linear_10x":
        decayed = 1.0 - 0.9 * progress
    else:  # wsd
        decayed = jnp.clip((1.0 - frac) / wsd_decay_frac, 0.0, 1.0)
    warming = jnp.clip(frac / max(warmup_frac, 1e-30), 0.0, 1.0)
    return jnp.where(frac < warmup_frac, warming, decayed)


def make_schedule(name: str, total_steps: int, warmup_steps: int,
                  wsd_decay_frac: float = 0.2) -> Callable[[jax.Array], jax.Array]:
    """Schedule multiplier (peak 1) of the update taken after `step` updates: normalized at step/T."""
    if total_steps <= 0:
        raise ConfigError(f"total_steps = {total_steps}: a schedule needs at least one step")
    warmup_frac = warmup_steps / total_steps
    check_schedule(name, warmup_frac, wsd_decay_frac)
    return lambda step: normalized(name, jnp.asarray(step, jnp.float32) / total_steps,
                                   warmup_frac, wsd_decay_frac)


def ema_coefficients(lr_T: jax.Array, weight_decay: float, t: int = -1) -> jax.Array:
    """Straight-to-Zero EMA weights c_{t,i} = η_i λ Π_{j=i+1..t}(1 − η_j λ) of updates i = 0..T-1.

    AdamW is θ_t = [Π_{j≤t}(1 − η_j λ)] θ_0 + Σ_i c_{t,i} x_i with x_i = −(Adam direction)_i / λ;
    `lr_T` holds the per-step η_j actually applied, `t` the step (default the last). Zero for i > t.
    """
    decay_T = jnp.asarray(lr_T, jnp.float32) * weight_decay
    log_keep_T = jnp.cumsum(jnp.log1p(-decay_T))  # Σ_{j≤k} log(1 − η_j λ)
    t = t % decay_T.shape[0]
    c_T = decay_T * jnp.exp(log_keep_T[t] - log_keep_T)
    return jnp.where(jnp.arange(decay_T.shape[0]) <= t, c_T, 0.0)


def plot_ema_coefficients(lrs: Mapping[str, jax.Array], weight_decay: float, path: str) -> str:
    """Plots c_{T,i} against t̂ = i/T for each labelled per-step LR sequence; saves to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, lr_T in lrs.items():
        c_T = ema_coefficients(lr_T, weight_decay)
        ax.plot(jnp.arange(c_T.shape[0]) / c_T.shape[0], c_T, label=label)
    ax.set_xlabel("update i / T")
    ax.set_ylabel("EMA weight $c_{T,i}$ in final weights")
    ax.set_title(f"AdamW as an EMA of updates (λ = {weight_decay:.3g})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
