"""Family-aware reference: model how normalized curves drift with size and extrapolate to a target N.

Collapse is never perfect: normalized curves of a family drift slowly with N. Given references at
several sizes, fit log l(t̂) = a(t̂) + b(t̂)·log N at every t̂ (least squares across the references) and
evaluate it at the target's N. Every reference is 1 at t̂ = 1, so the extrapolated curve is too.
Aligning a partial run to this curve (curves.early_align) predicts its final loss; with references of a
single size it reduces to their geometric mean, i.e. single-reference alignment.
"""

import jax
import jax.numpy as jnp


@jax.jit
def family_curve(curves_KxG: jax.Array, n_params_K: jax.Array, n_target: float) -> jax.Array:
    """The normalized curve at N = `n_target`, from K references (normalized curves) with their N."""
    x_K = jnp.log(jnp.asarray(n_params_K, jnp.float32))
    y_KxG = jnp.log(jnp.asarray(curves_KxG, jnp.float32))
    dx_K = x_K - jnp.mean(x_K)
    var = jnp.sum(dx_K**2)
    slope_G = jnp.where(var > 0, dx_K @ (y_KxG - jnp.mean(y_KxG, axis=0)) / jnp.where(var > 0, var, 1.0),
                        0.0)
    return jnp.exp(jnp.mean(y_KxG, axis=0) + slope_G * (jnp.log(n_target) - jnp.mean(x_K)))
