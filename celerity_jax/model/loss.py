"""Next-token cross-entropy with an optional z-loss (PaLM), computed in float32."""

import jax
import jax.numpy as jnp


def cross_entropy(logits_BxLxV: jax.Array, targets_BxL: jax.Array,
                  z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean over tokens of −log p(target) + z_loss·(log Z)²; aux holds both terms separately."""
    logits_BxLxV = logits_BxLxV.astype(jnp.float32)
    log_z_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
    target_logit_BxL = jnp.take_along_axis(logits_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
    ce = jnp.mean(log_z_BxL - target_logit_BxL)
    z_term = jnp.mean(jnp.square(log_z_BxL))
    return ce + z_loss * z_term, {"cross_entropy": ce, "z_loss": z_term}
