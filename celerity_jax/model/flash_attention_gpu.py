"""Causal flash attention as Pallas GPU (Triton) kernels, with ALiBi computed inside the kernel.

The same function and the same algorithm as the TPU kernels of `flash_attention.py` (online softmax forward,
FlashAttention-2 backward from the saved float32 logsumexp, no L×L scores or bias in memory), written the way
Triton wants it: one program per (batch, head, block) that loops over the blocks it needs with `fori_loop` and
reads them from the whole sequence of its head. Causal skipping is in the loop bounds: a query block visits
the key blocks up to the diagonal, a key block the query blocks from the diagonal on. The inputs stay in their
[B, L, H, K] layout (Triton takes any strides).

Triton needs power-of-two block shapes of at least 16: a head_dim that is not one (or under 16) is padded with
zero features, a length that 16 does not divide is padded with zero positions at the end (keys after every real
query, so the causal mask hides them), and the block sizes are powers of two dividing L.

Grouped-query attention: k and v may have G heads for q's H (G dividing H); the program of query head h reads
key/value head h // (H/G), so k and v are never repeated. The dk/dv kernel computes each query head's float32
share of dk and dv, which are summed over the H/G query heads of each group outside the kernel.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from celerity_jax.model.attention import kv_group_size
from celerity_jax.model.flash_common import MASKED, KernelConfig, block_size, checked_slopes, out_like


MIN_BLOCK = 16  # the smallest tile Triton's dot takes


def flash_attention_gpu(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *, scale: float, alibi_slopes_H=None,
                        block_q: int | None = None, block_k: int | None = None, interpret: bool = False):
    """softmax(scale·q·kᵀ + bias, causal)·v per query head; out_BxLxHxK in v's dtype.

    k, v: G key/value heads, G dividing H (query head h uses key/value head h // (H/G)).
    alibi_slopes_H: per-query-head ALiBi slopes (bias −slope·(i − j) for key j ≤ query i); None for no bias.
    block_q, block_k: query and key rows per block, powers of two, clamped to L; they must divide L, which is
    first padded to a multiple of 16. Default: the largest power of two up to 64 that divides it.
    interpret: run the kernels in the Pallas interpreter (on any backend, e.g. CPU tests).
    """
    kv_group_size(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK)
    slopes_H = checked_slopes(q_BxLxHxK, alibi_slopes_H)
    _, seq_len, n_heads, head_dim = q_BxLxHxK.shape
    padded_len = -(-seq_len // MIN_BLOCK) * MIN_BLOCK
    if padded_len != seq_len:
        pad = lambda x: jnp.pad(x, ((0, 0), (0, padded_len - seq_len), (0, 0), (0, 0)))  # noqa: E731
        out = flash_attention_gpu(pad(q_BxLxHxK), pad(k_BxLxGxK), pad(v_BxLxGxK), scale=scale,
                                  alibi_slopes_H=alibi_slopes_H, block_q=block_q, block_k=block_k,
                                  interpret=interpret)
        return out[:, :seq_len]
    padded_dim = max(MIN_BLOCK, _next_power_of_two(head_dim))
    if padded_dim != head_dim:  # zero features change no score and add output columns that are cut off
        pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, padded_dim - head_dim)))  # noqa: E731
        out = flash_attention_gpu(pad(q_BxLxHxK), pad(k_BxLxGxK), pad(v_BxLxGxK), scale=scale,
                                  alibi_slopes_H=alibi_slopes_H, block_q=block_q, block_k=block_k,
                                  interpret=interpret)
        return out[..., :head_dim]
    default = seq_len & -seq_len  # the largest power of two dividing L
    cfg = KernelConfig(scale=float(scale),
                  block_q=_power_of_two("block_q", block_size("block_q", block_q or min(default, 64), seq_len)),
                  block_k=_power_of_two("block_k", block_size("block_k", block_k or min(default, 64), seq_len)),
                  alibi=alibi_slopes_H is not None, interpret=interpret)
    # A whole power-of-two vector of slopes, from which each program picks its head's.
    slopes = jnp.zeros((_next_power_of_two(n_heads),), jnp.float32).at[:n_heads].set(slopes_H)
    return _attention(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes)


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _power_of_two(name: str, block: int) -> int:
    if block & (block - 1):
        raise ValueError(f"{name}={block} is not a power of two, which Triton needs; pass a power of two that "
                         "divides the sequence length")
    return block


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes):
    return _attention_fwd(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes)[0]


def _attention_fwd(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes):
    out_BxLxHxK, lse_BxHxL = _forward(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes)
    # named for the remat policies that keep the attention (`transformer.REMAT_POLICIES`)
    out_BxLxHxK, lse_BxHxL = checkpoint_name(out_BxLxHxK, "context"), checkpoint_name(lse_BxHxL, "context_lse")
    return out_BxLxHxK, (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes, out_BxLxHxK, lse_BxHxL)


def _attention_bwd(cfg, residuals, dout_BxLxHxK):
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes, out_BxLxHxK, lse_BxHxL = residuals
    dout_BxLxHxK = dout_BxLxHxK.astype(out_BxLxHxK.dtype)
    d_BxHxL = jnp.einsum("blhk,blhk->bhl", dout_BxLxHxK.astype(jnp.float32), out_BxLxHxK.astype(jnp.float32))
    args = (slopes, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, dout_BxLxHxK, lse_BxHxL, d_BxHxL)
    dq_BxLxHxK = _backward_dq(cfg, *args)
    dk, dv = _backward_dkv(cfg, *args)
    b, l, n_kv_heads, head_dim = k_BxLxGxK.shape
    group = q_BxLxHxK.shape[2] // n_kv_heads
    if group == 1:
        dk_BxLxGxK, dv_BxLxGxK = dk, dv
    else:  # float32 shares per query head, summed over each group
        dk_BxLxGxK, dv_BxLxGxK = (g.reshape(b, l, n_kv_heads, group, head_dim).sum(axis=3).astype(x.dtype)
                                  for g, x in ((dk, k_BxLxGxK), (dv, v_BxLxGxK)))
    return dq_BxLxHxK, dk_BxLxGxK, dv_BxLxGxK, jnp.zeros_like(slopes)  # the slopes are constants of the model


_attention.defvjp(_attention_fwd, _attention_bwd)


# ---------------------------------------------------------------------------------------------------------
# Specs and shared block math. Grids are (batch, head, block); a program sees one head of one sequence.


def _block_spec(rows: int, head_dim: int, group: int = 1):
    """Block i of `rows` positions of head h // group: with group = H/G, the key/value head of query head h."""
    return pl.BlockSpec((None, rows, None, head_dim), lambda b, h, i: (b, i, h // group, 0))


def _head_spec(seq_len: int, head_dim: int, group: int = 1):
    """The whole sequence of the program's head (h // group, as in `_block_spec`), which the kernel slices block
    by block."""
    return pl.BlockSpec((None, seq_len, None, head_dim), lambda b, h, i: (b, 0, h // group, 0))


def _stats_spec(rows: int):
    return pl.BlockSpec((None, None, rows), lambda b, h, i: (b, h, i))


def _slopes_spec(slopes):
    return pl.BlockSpec(slopes.shape, lambda b, h, i: (0,))


def _call(cfg, kernel, q_BxLxHxK, block: int, in_specs, out_specs, out_shape):
    batch, seq_len, n_heads, _ = q_BxLxHxK.shape
    return pl.pallas_call(functools.partial(kernel, cfg=cfg), grid=(batch, n_heads, seq_len // block),
                          in_specs=in_specs, out_specs=out_specs, out_shape=out_shape, interpret=cfg.interpret,
                          compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2))


def _head_slope(slopes_ref):
    slopes = slopes_ref[...]
    return jnp.sum(jnp.where(jnp.arange(slopes.shape[0]) == pl.program_id(1), slopes, 0.0))


def _scores(cfg, q_QxK, k_SxK, slope, q_start, k_start):
    """scale·q·kᵀ + ALiBi in float32, with the keys after a query masked to MASKED."""
    q_pos_Qx1 = (q_start + jnp.arange(q_QxK.shape[0]))[:, None]
    k_pos_1xS = (k_start + jnp.arange(k_SxK.shape[0]))[None, :]
    s_QxS = pltriton.dot(q_QxK, k_SxK, trans_b=True).astype(jnp.float32) * cfg.scale
    if cfg.alibi:
        s_QxS = s_QxS + slope * (k_pos_1xS - q_pos_Qx1).astype(jnp.float32)
    return jnp.where(k_pos_1xS <= q_pos_Qx1, s_QxS, MASKED)


def _key_blocks_upto(cfg, q_start):
    """How many key blocks hold a key at or before the query block's last query."""
    return lax.div(q_start + cfg.block_q + cfg.block_k - 1, cfg.block_k)


# ---------------------------------------------------------------------------------------------------------
# Forward.


def _forward(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes):
    batch, seq_len, n_heads, head_dim = q_BxLxHxK.shape
    kv_spec = _head_spec(seq_len, head_dim, n_heads // k_BxLxGxK.shape[2])
    in_specs = [_slopes_spec(slopes), _block_spec(cfg.block_q, head_dim), kv_spec, kv_spec]
    out_specs = [_block_spec(cfg.block_q, head_dim), _stats_spec(cfg.block_q)]
    out_shape = [out_like(q_BxLxHxK, v_BxLxGxK.dtype), out_like(q_BxLxHxK, jnp.float32, (batch, n_heads, seq_len))]
    return _call(cfg, _forward_kernel, q_BxLxHxK, cfg.block_q, in_specs, out_specs, out_shape)(
        slopes, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK)


def _forward_kernel(slopes_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, *, cfg):
    bq, bk = cfg.block_q, cfg.block_k
    q_start = pl.program_id(2) * bq
    q_QxK = q_ref[...]
    slope = _head_slope(slopes_ref)

    def step(kb, carry):
        acc_QxK, max_Q, sum_Q = carry
        keys = pl.ds(kb * bk, bk)
        s_QxS = _scores(cfg, q_QxK, k_ref[keys, :], slope, q_start, kb * bk)
        new_max_Q = jnp.maximum(max_Q, jnp.max(s_QxS, axis=1))
        p_QxS = jnp.exp(s_QxS - new_max_Q[:, None])
        rescale_Q = jnp.exp(max_Q - new_max_Q)
        v_SxK = v_ref[keys, :]
        acc_QxK = rescale_Q[:, None] * acc_QxK + pltriton.dot(p_QxS.astype(v_SxK.dtype), v_SxK).astype(jnp.float32)
        return acc_QxK, new_max_Q, rescale_Q * sum_Q + jnp.sum(p_QxS, axis=1)

    init = (jnp.zeros(q_QxK.shape, jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
            jnp.zeros((bq,), jnp.float32))
    acc_QxK, max_Q, sum_Q = lax.fori_loop(0, _key_blocks_upto(cfg, q_start), step, init)
    out_ref[...] = (acc_QxK / sum_Q[:, None]).astype(out_ref.dtype)
    lse_ref[...] = max_Q + jnp.log(sum_Q)


# ---------------------------------------------------------------------------------------------------------
# Backward: dS = P ∘ (dP − D) with P = exp(S − logsumexp), dP = dO·vᵀ, D = rowsum(dO ∘ O).


def _backward_dq(cfg, slopes, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, dout_BxLxHxK, lse_BxHxL, d_BxHxL):
    _, seq_len, n_heads, head_dim = q_BxLxHxK.shape
    q_spec, kv_spec = _block_spec(cfg.block_q, head_dim), _head_spec(seq_len, head_dim, n_heads // k_BxLxGxK.shape[2])
    in_specs = [_slopes_spec(slopes), q_spec, kv_spec, kv_spec, q_spec, _stats_spec(cfg.block_q),
                _stats_spec(cfg.block_q)]
    return _call(cfg, _dq_kernel, q_BxLxHxK, cfg.block_q, in_specs, q_spec, out_like(q_BxLxHxK, q_BxLxHxK.dtype))(
        slopes, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, dout_BxLxHxK, lse_BxHxL, d_BxHxL)


def _dq_kernel(slopes_ref, q_ref, k_ref, v_ref, dout_ref, lse_ref, d_ref, dq_ref, *, cfg):
    bk = cfg.block_k
    q_start = pl.program_id(2) * cfg.block_q
    q_QxK, dout_QxK, lse_Q, d_Q = q_ref[...], dout_ref[...], lse_ref[...], d_ref[...]
    slope = _head_slope(slopes_ref)

    def step(kb, dq_QxK):
        keys = pl.ds(kb * bk, bk)
        k_SxK = k_ref[keys, :]
        p_QxS = jnp.exp(_scores(cfg, q_QxK, k_SxK, slope, q_start, kb * bk) - lse_Q[:, None])
        dp_QxS = pltriton.dot(dout_QxK, v_ref[keys, :], trans_b=True).astype(jnp.float32)
        ds_QxS = p_QxS * (dp_QxS - d_Q[:, None])
        return dq_QxK + pltriton.dot(ds_QxS.astype(k_SxK.dtype), k_SxK).astype(jnp.float32)

    dq_QxK = lax.fori_loop(0, _key_blocks_upto(cfg, q_start), step, jnp.zeros(q_QxK.shape, jnp.float32))
    dq_ref[...] = (dq_QxK * cfg.scale).astype(dq_ref.dtype)


def _backward_dkv(cfg, slopes, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, dout_BxLxHxK, lse_BxHxL, d_BxHxL):
    """dk and dv; with groups (G < H), each query head's float32 share of them instead, q-shaped."""
    _, seq_len, n_heads, head_dim = q_BxLxHxK.shape
    group = n_heads // k_BxLxGxK.shape[2]
    k_spec, whole = _block_spec(cfg.block_k, head_dim, group), _head_spec(seq_len, head_dim)
    whole_stats = pl.BlockSpec((None, None, seq_len), lambda b, h, i: (b, h, 0))
    in_specs = [_slopes_spec(slopes), whole, k_spec, k_spec, whole, whole_stats, whole_stats]
    if group == 1:
        out_spec, out_shape = k_spec, [out_like(k_BxLxGxK, k_BxLxGxK.dtype), out_like(v_BxLxGxK, v_BxLxGxK.dtype)]
    else:
        out_spec, out_shape = _block_spec(cfg.block_k, head_dim), [out_like(q_BxLxHxK, jnp.float32)] * 2
    return _call(cfg, _dkv_kernel, q_BxLxHxK, cfg.block_k, in_specs, [out_spec, out_spec], out_shape)(
        slopes, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, dout_BxLxHxK, lse_BxHxL, d_BxHxL)


def _dkv_kernel(slopes_ref, q_ref, k_ref, v_ref, dout_ref, lse_ref, d_ref, dk_ref, dv_ref, *, cfg):
    bq = cfg.block_q
    k_start = pl.program_id(2) * cfg.block_k
    k_SxK, v_SxK = k_ref[...], v_ref[...]
    slope = _head_slope(slopes_ref)

    def step(qb, carry):
        dk_SxK, dv_SxK = carry
        queries = pl.ds(qb * bq, bq)
        q_QxK, dout_QxK = q_ref[queries, :], dout_ref[queries, :]
        p_QxS = jnp.exp(_scores(cfg, q_QxK, k_SxK, slope, qb * bq, k_start) - lse_ref[queries][:, None])
        dv_SxK = dv_SxK + pltriton.dot(p_QxS.astype(dout_QxK.dtype), dout_QxK, trans_a=True).astype(jnp.float32)
        dp_QxS = pltriton.dot(dout_QxK, v_SxK, trans_b=True).astype(jnp.float32)
        ds_QxS = p_QxS * (dp_QxS - d_ref[queries][:, None])
        dk_SxK = dk_SxK + pltriton.dot(ds_QxS.astype(q_QxK.dtype), q_QxK, trans_a=True).astype(jnp.float32)
        return dk_SxK, dv_SxK

    zeros = jnp.zeros(k_SxK.shape, jnp.float32)
    first = k_start // bq  # the query block holding the key block's first key, on the diagonal
    dk_SxK, dv_SxK = lax.fori_loop(first, q_ref.shape[0] // bq, step, (zeros, zeros))
    dk_ref[...] = (dk_SxK * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_SxK.astype(dv_ref.dtype)
