"""Position information: ALiBi score biases (Press et al. 2022) and rotary embeddings (Su et al. 2021)."""

import math

import jax.numpy as jnp
import numpy as np


def alibi_slopes(n_heads: int) -> np.ndarray:
    """Per-head slopes: the geometric series 2^(−8k/n) for a power of two n; otherwise those of the
    nearest lower power of two followed by every other slope of the next one (the ALiBi recipe)."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (k + 1) / n) for k in range(n)]

    low = 2 ** math.floor(math.log2(n_heads))
    slopes = geometric(low) + geometric(2 * low)[0::2][: n_heads - low]
    return np.asarray(slopes, dtype=np.float32)


def alibi_bias(n_heads: int, seq_len: int) -> jnp.ndarray:
    """Additive score bias_1xHxLxL = −slope_h·(i − j); the causal mask removes j > i."""
    dist_LxL = jnp.arange(seq_len)[:, None] - jnp.arange(seq_len)[None, :]
    slopes_H = jnp.asarray(alibi_slopes(n_heads))
    return (-slopes_H[:, None, None] * dist_LxL.astype(jnp.float32))[None]


def apply_rope(x_BxLxHxK: jnp.ndarray, theta: float, positions_BxL: jnp.ndarray | None = None) -> jnp.ndarray:
    """Rotate the two halves of each head's features by position-dependent angles (in float32). positions_BxL:
    each token's position (default 0..L−1 in every row; a decode step passes where its tokens sit)."""
    seq_len, head_dim = x_BxLxHxK.shape[1], x_BxLxHxK.shape[3]
    inv_freq_K2 = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    if positions_BxL is None:
        positions_BxL = jnp.arange(seq_len)[None, :]
    angle_BxLxK2 = positions_BxL.astype(jnp.float32)[..., None] * inv_freq_K2
    cos, sin = jnp.cos(angle_BxLxK2)[:, :, None, :], jnp.sin(angle_BxLxK2)[:, :, None, :]
    x1, x2 = jnp.split(x_BxLxHxK.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x_BxLxHxK.dtype)
