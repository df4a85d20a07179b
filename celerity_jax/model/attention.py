"""Causal softmax attention as plain einsums over causal query blocks (ModelConfig.attention_impl "blocked").

Queries are split into `n_blocks` consecutive blocks; block i (queries up to position e_i) is scored only
against keys 0..e_i, so with 2 blocks a quarter of the L² score matrix (the first half of the queries
against the second half of the keys, all masked) is never computed. The causal mask is folded into
the additive score bias (ALiBi or none), so the softmax sees one precomputed term. Scores, softmax and
the mask are float32; the two matmuls take q/k/v in their own dtype. Computes the same function as
`jax.nn.dot_product_attention(..., is_causal=True)` up to float rounding.
"""

import jax
import jax.numpy as jnp

_MASKED = -1e30  # exp(_MASKED - max) is exactly 0 in float32


def causal_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, *, scale: float, alibi_slopes_H=None, n_blocks: int = 2):
    """softmax(scale·q·kᵀ + bias, causal) · v, per head; out_BxLxHxK in v's dtype.

    alibi_slopes_H: per-head ALiBi slopes (bias −slope·(i − j)); None for no bias (RoPE, learned positions).
    """
    seq_len = q_BxLxHxK.shape[1]
    edges = sorted({round(seq_len * i / n_blocks) for i in range(1, n_blocks + 1)} - {0})
    out, start = [], 0
    for end in edges:
        q_BxQxHxK = q_BxLxHxK[:, start:end]
        bias_HxQxS = _causal_bias(start, end, alibi_slopes_H)
        scores_BxHxQxS = jnp.einsum("bqhk,bshk->bhqs", q_BxQxHxK, k_BxLxHxK[:, :end],
                                    preferred_element_type=jnp.float32) * scale + bias_HxQxS
        probs_BxHxQxS = jax.nn.softmax(scores_BxHxQxS, axis=-1).astype(v_BxLxHxK.dtype)
        out.append(jnp.einsum("bhqs,bshk->bqhk", probs_BxHxQxS, v_BxLxHxK[:, :end]))
        start = end
    return out[0] if len(out) == 1 else jnp.concatenate(out, axis=1)


def cached_attention(q_BxLxHxK, k_BxSxHxK, v_BxSxHxK, positions_BxL, *, scale: float, alibi_slopes_H=None):
    """Attention of L new queries per row against a KV cache of S slots, in which slot j holds position j.

    Query i of row b sits at positions_BxL[b, i] and sees the slots j ≤ that position; the others (later
    positions, or slots a shorter prompt left unwritten) are masked. Same function as `causal_attention` over
    the cached prefix, up to float rounding."""
    dist_BxLxS = positions_BxL[:, :, None] - jnp.arange(k_BxSxHxK.shape[1])[None, None, :]
    visible_Bx1xLxS = (dist_BxLxS >= 0)[:, None]
    if alibi_slopes_H is None:
        bias_BxHxLxS = jnp.where(visible_Bx1xLxS, 0.0, _MASKED)
    else:
        slopes_1xHx1x1 = jnp.asarray(alibi_slopes_H, jnp.float32)[None, :, None, None]
        bias_BxHxLxS = jnp.where(visible_Bx1xLxS, -slopes_1xHx1x1 * dist_BxLxS[:, None].astype(jnp.float32), _MASKED)
    scores_BxHxLxS = jnp.einsum("blhk,bshk->bhls", q_BxLxHxK, k_BxSxHxK,
                                preferred_element_type=jnp.float32) * scale + bias_BxHxLxS
    probs_BxHxLxS = jax.nn.softmax(scores_BxHxLxS, axis=-1).astype(v_BxSxHxK.dtype)
    return jnp.einsum("bhls,bshk->blhk", probs_BxHxLxS, v_BxSxHxK)


def _causal_bias(start: int, end: int, alibi_slopes_H):
    """Float32 bias for queries start..end−1 against keys 0..end−1: ALiBi (or 0) where j ≤ i, masked above."""
    i_Qx1 = jnp.arange(start, end)[:, None]
    j_1xS = jnp.arange(end)[None, :]
    visible_QxS = j_1xS <= i_Qx1
    if alibi_slopes_H is None:
        return jnp.where(visible_QxS, 0.0, _MASKED).astype(jnp.float32)[None]
    dist_QxS = (i_Qx1 - j_1xS).astype(jnp.float32)
    slopes_Hx1x1 = jnp.asarray(alibi_slopes_H, jnp.float32)[:, None, None]
    return jnp.where(visible_QxS[None], -slopes_Hx1x1 * dist_QxS[None], _MASKED)
