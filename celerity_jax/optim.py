"""τ-pinned AdamW as an optax chain, with CompleteP's per-leaf Adam eps and LR multipliers.

Per leaf the update is θ ← θ − η_base·s_t·lr_mult·(adam_dir + c·λ·θ), s_t the schedule (peak 1) and c the
leaf's λ multiplier under the plan's decay convention (0 on leaves that do not decay; model/completep.py):
a hidden matrix decays by η_hidden,t·c_hidden·λ per step, the rate τ is defined with.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax

from celerity_jax import schedules
from celerity_jax.model import completep


def scale_by_adam_per_leaf_eps(b1: float, b2: float, eps: Any) -> optax.GradientTransformation:
    """Adam's bias-corrected m̂/(sqrt(v̂) + eps) with `eps` a pytree of floats mirroring the params."""

    def init_fn(params):
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                      mu=optax.tree.zeros_like(params),
                                      nu=optax.tree.zeros_like(params))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        mu_hat = optax.tree.bias_correction(mu, b1, count)
        nu_hat = optax.tree.bias_correction(nu, b2, count)
        updates = jax.tree.map(lambda m, v, e: m / (jnp.sqrt(v) + e), mu_hat, nu_hat, eps)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def scale_by_tree(multipliers: Any) -> optax.GradientTransformation:
    """Multiplies each update leaf by its float in `multipliers` (a pytree mirroring the params)."""
    return optax.stateless(
        lambda updates, params: jax.tree.map(lambda u, m: u * m, updates, multipliers))


def add_scaled_decayed_weights(weight_decay: float, decay_mask: Any,
                               decay_scales: Any) -> optax.GradientTransformation:
    """+ weight_decay·c·θ on the leaves `decay_mask` selects, c from `decay_scales` (floats mirroring the
    params). Masked as optax.add_decayed_weights(weight_decay, mask=decay_mask), so the optimizer state keeps
    that layout; with every c = 1 the update is the same, bit for bit."""
    masked_scales = jax.tree.map(lambda m, c: c if m else optax.MaskedNode(), decay_mask, decay_scales)

    def update_fn(updates, state, params):
        return jax.tree.map(lambda u, c, p: u + weight_decay * c * p, updates, masked_scales, params), state

    return optax.masked(optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn), decay_mask)


def tau_pinned_adamw(learning_rate: float, weight_decay: float, *, b1: float, b2: float, eps: Any,
                     lr_multipliers: Any, decay_mask: Any, grad_clip: float,
                     decay_scales: Any = None) -> optax.GradientTransformation:
    """Clip (if grad_clip > 0), Adam with per-leaf eps, + c·λ·θ on decaying leaves (c from `decay_scales`;
    None: 1), × lr_mult, × −lr."""
    if decay_scales is None:
        decay_scales = jax.tree.map(lambda _: 1.0, decay_mask)
    return optax.chain(
        optax.clip_by_global_norm(grad_clip) if grad_clip > 0 else optax.identity(),
        scale_by_adam_per_leaf_eps(b1, b2, eps),
        add_scaled_decayed_weights(weight_decay, decay_mask, decay_scales),
        scale_by_tree(lr_multipliers),
        optax.scale_by_learning_rate(learning_rate),
    )


def build_optimizer(plan, multipliers) -> optax.GradientTransformation:
    """The plan's optimizer; `multipliers` (`completep.multipliers`) has pytrees `role`, `lr`, `eps` (floats) and
    `decay` (bools).

    The base LR η_base·s_t and λ are injected hyperparameters, so they live in the optimizer state
    (read them with `optimizer_metrics`). Each leaf's λ multiplier is its role's in `plan.weight_decay_mult`.
    """
    schedule = schedules.make_schedule(plan.schedule, plan.steps, plan.warmup_steps,
                                       plan.wsd_decay_frac)
    eps = jax.tree.map(lambda m: plan.adam_eps * m, multipliers.eps)
    decay_scales = jax.tree.map(lambda role: plan.weight_decay_mult[role.value], multipliers.role)
    static = ("b1", "b2", "eps", "lr_multipliers", "decay_mask", "grad_clip", "decay_scales")
    return optax.inject_hyperparams(tau_pinned_adamw, static_args=static)(
        learning_rate=lambda count: plan.base_lr * schedule(count),
        weight_decay=plan.weight_decay,
        b1=plan.adam_b1, b2=plan.adam_b2, eps=eps, lr_multipliers=multipliers.lr,
        decay_mask=multipliers.decay, grad_clip=plan.grad_clip, decay_scales=decay_scales)


def optimizer_metrics(plan, opt_state) -> dict[str, jax.Array]:
    """Hidden-matrix LR η_hidden,t of the last update, λ, and τ_t = 1/(η_hidden,t·c_hidden·λ·T) (jit-able)."""
    hyperparams = optax.tree_utils.tree_get(opt_state, "hyperparams")
    lr_hidden = hyperparams["learning_rate"] * (plan.lr_hidden / plan.base_lr)
    weight_decay = hyperparams["weight_decay"]
    hidden_decay = weight_decay * plan.weight_decay_mult[completep.Role.HIDDEN.value]
    return {"lr": lr_hidden, "weight_decay": weight_decay,
            "tau": 1.0 / (lr_hidden * hidden_decay * plan.steps)}
