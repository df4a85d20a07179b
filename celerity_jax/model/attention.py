"""Causal softmax attention as plain einsums over causal query blocks (ModelConfig.attention_impl "blocked").

Queries are split into `n_blocks` consecutive blocks; block i (queries up to position e_i) is scored only
against keys 0..e_i, so with 2 blocks a quarter of the L² score matrix (the first half of the queries
against the second half of the keys, all masked) is never computed. The causal mask is folded into
the additive score bias (ALiBi or none), so the softmax sees one precomputed term. Scores, softmax and
the mask are float32; the two matmuls take q/k/v in their own dtype. Computes the same function as
`jax.nn.dot_product_attention(..., is_causal=True)` up to float rounding.

Grouped-query attention: k and v may have G heads for q's H, G dividing H; query head h attends with key/value
head h // (H/G) (each key/value head serves H/G consecutive query heads, as `repeat_kv` in Llama). The queries
are then grouped as [.., G, H/G, K] against the G key/value heads, without repeating k and v.
"""

import jax
import jax.numpy as jnp

_MASKED = -1e30  # exp(_MASKED - max) is exactly 0 in float32


def kv_group_size(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, *, same_length: bool = True) -> int:
    """H/G, the query heads per key/value head, after checking that q is [B, L, H, K] and k, v share one
    [B, S, G, K] shape (S = L if `same_length`) with G dividing H; ValueError otherwise."""
    shapes = f"q {q_BxLxHxK.shape}, k {k_BxSxGxK.shape}, v {v_BxSxGxK.shape}"
    shared_dims = (0, 1, 3) if same_length else (0, 3)
    if (q_BxLxHxK.ndim != 4 or k_BxSxGxK.ndim != 4 or k_BxSxGxK.shape != v_BxSxGxK.shape
            or any(q_BxLxHxK.shape[i] != k_BxSxGxK.shape[i] for i in shared_dims)):
        length = "length" if same_length else "slots"
        raise ValueError(f"attention takes q [batch, length, heads, head_dim] and k, v of one [batch, {length}, "
                         f"kv_heads, head_dim] shape; got {shapes}")
    n_heads, n_kv_heads = q_BxLxHxK.shape[2], k_BxSxGxK.shape[2]
    if n_heads % n_kv_heads:
        raise ValueError(f"the {n_heads} query heads do not split into groups over the {n_kv_heads} key/value "
                         f"heads ({shapes}); choose a number of key/value heads that divides the query heads")
    return n_heads // n_kv_heads


def causal_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *, scale: float, alibi_slopes_H=None, n_blocks: int = 2):
    """softmax(scale·q·kᵀ + bias, causal) · v, per query head; out_BxLxHxK in v's dtype.

    k, v: G key/value heads, G dividing H (query head h uses key/value head h // (H/G)).
    alibi_slopes_H: per-query-head ALiBi slopes (bias −slope·(i − j)); None for no bias (RoPE, learned positions).
    """
    kv_group_size(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK)
    seq_len = q_BxLxHxK.shape[1]
    edges = sorted({round(seq_len * i / n_blocks) for i in range(1, n_blocks + 1)} - {0})
    out, start = [], 0
    for end in edges:
        q_BxQxHxK = q_BxLxHxK[:, start:end]
        bias_HxQxS = _causal_bias(start, end, alibi_slopes_H)
        out.append(_attend(q_BxQxHxK, k_BxLxGxK[:, :end], v_BxLxGxK[:, :end], bias_HxQxS, scale))
        start = end
    return out[0] if len(out) == 1 else jnp.concatenate(out, axis=1)


def cached_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, positions_BxL, *, scale: float, alibi_slopes_H=None):
    """Attention of L new queries per row against a KV cache of S slots, in which slot j holds position j.

    Query i of row b sits at positions_BxL[b, i] and sees the slots j ≤ that position; the others (later
    positions, or slots a shorter prompt left unwritten) are masked. The cache holds G key/value heads, G dividing
    H, as in `causal_attention`. Same function as `causal_attention` over the cached prefix, up to float
    rounding."""
    kv_group_size(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, same_length=False)
    dist_BxLxS = positions_BxL[:, :, None] - jnp.arange(k_BxSxGxK.shape[1])[None, None, :]
    visible_Bx1xLxS = (dist_BxLxS >= 0)[:, None]
    if alibi_slopes_H is None:
        bias_BxHxLxS = jnp.where(visible_Bx1xLxS, 0.0, _MASKED)
    else:
        slopes_1xHx1x1 = jnp.asarray(alibi_slopes_H, jnp.float32)[None, :, None, None]
        bias_BxHxLxS = jnp.where(visible_Bx1xLxS, -slopes_1xHx1x1 * dist_BxLxS[:, None].astype(jnp.float32), _MASKED)
    return _attend(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, bias_BxHxLxS, scale)


def _attend(q_BxQxHxK, k_BxSxGxK, v_BxSxGxK, bias, scale: float):
    """softmax(scale·q·kᵀ + bias)·v with float32 scores; `bias` broadcasts against the [B, H, Q, S] scores."""
    batch, n_queries, n_heads, head_dim = q_BxQxHxK.shape
    n_kv_heads = k_BxSxGxK.shape[2]
    if n_kv_heads == n_heads:
        scores_BxHxQxS = jnp.einsum("bqhk,bshk->bhqs", q_BxQxHxK, k_BxSxGxK,
                                    preferred_element_type=jnp.float32) * scale + bias
        probs_BxHxQxS = jax.nn.softmax(scores_BxHxQxS, axis=-1).astype(v_BxSxGxK.dtype)
        return jnp.einsum("bhqs,bshk->bqhk", probs_BxHxQxS, v_BxSxGxK)
    group = n_heads // n_kv_heads
    q_BxQxGxRxK = q_BxQxHxK.reshape(batch, n_queries, n_kv_heads, group, head_dim)
    scores_BxGxRxQxS = jnp.einsum("bqgrk,bsgk->bgrqs", q_BxQxGxRxK, k_BxSxGxK, preferred_element_type=jnp.float32)
    scores_BxHxQxS = scores_BxGxRxQxS.reshape(batch, n_heads, n_queries, -1) * scale + bias
    probs_BxHxQxS = jax.nn.softmax(scores_BxHxQxS, axis=-1).astype(v_BxSxGxK.dtype)
    probs_BxGxRxQxS = probs_BxHxQxS.reshape(batch, n_kv_heads, group, n_queries, -1)
    out_BxQxGxRxK = jnp.einsum("bgrqs,bsgk->bqgrk", probs_BxGxRxQxS, v_BxSxGxK)
    return out_BxQxGxRxK.reshape(batch, n_queries, n_heads, head_dim)


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
