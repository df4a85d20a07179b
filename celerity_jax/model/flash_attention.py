"""Causal flash attention as Pallas TPU kernels, with ALiBi computed inside the kernel (the GPU's twin is
`flash_attention_gpu.py`).

Computes the same function as `attention.causal_attention` (softmax(scale·q·kᵀ + bias, causal)·v per head)
without materializing the L×L scores: the forward pass keeps an online softmax (float32 running max, sum
and accumulator) over key blocks; the backward pass (a `jax.custom_vjp`) recomputes the scores per block
from the saved float32 logsumexp, as in FlashAttention-2: one kernel accumulates dq over key blocks,
another dk and dv over query blocks.

Causal skipping: each kernel's grid runs over the (query block, key block) pairs on or below the diagonal
only, listed in small int32 tables passed as scalar prefetch; of those, only the blocks the diagonal
crosses apply the mask. The ALiBi bias slope_h·(j − i) comes from the block's positions and the head's
slope (read from SMEM), so no L×L bias exists in memory; without slopes the same kernels serve RoPE and
learned positions.

Grouped-query attention: k and v may have G heads for q's H (G dividing H); query head h reads key/value head
h // (H/G) through the block index maps, so k and v are never repeated. The dk/dv kernel computes each query
head's float32 share of dk and dv, which are summed over the H/G query heads of each group outside the kernel.

Layout: with head_dim a multiple of 128 (or a single head) the kernels read [B, L, H·K], a free reshape
of the [B, L, H, K] inputs; otherwise the inputs are transposed to [B, H, L, K] first, because a TPU
block's last two dimensions must be (multiples of 8 and 128 or) whole.

Block sizes: each is clamped to L, and must then divide L (a ValueError says so otherwise). Compiled for
TPU, block_q must also be a multiple of 128 or equal L (the logsumexp is stored with queries along lanes)
and block_k a multiple of 8; interpret mode accepts any divisor of L.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from celerity_jax.model.attention import kv_group_size
from celerity_jax.model.flash_common import MASKED, KernelConfig, block_size, checked_slopes, out_like

_LANES = 128
_NT = (((1,), (1,)), ((), ()))  # dot_general dimension numbers for x·yᵀ


def flash_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *, scale: float, alibi_slopes_H=None,
                    block_q: int | None = None, block_k: int | None = None, interpret: bool = False):
    """softmax(scale·q·kᵀ + bias, causal)·v per query head; out_BxLxHxK in v's dtype.

    k, v: G key/value heads, G dividing H (query head h uses key/value head h // (H/G)).
    alibi_slopes_H: per-query-head ALiBi slopes (bias −slope·(i − j) for key j ≤ query i); None for no bias.
    block_q, block_k: query and key rows per kernel step, clamped to L; they must divide L. Default: 128 where it
    divides L, else L.
    interpret: run the kernels in the Pallas interpreter (on any backend, e.g. CPU tests).
    """
    kv_group_size(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK)
    slopes_H = checked_slopes(q_BxLxHxK, alibi_slopes_H)
    _, seq_len, n_heads, head_dim = q_BxLxHxK.shape
    default = 128 if seq_len % 128 == 0 else seq_len
    cfg = KernelConfig(scale=float(scale), block_q=block_size("block_q", block_q or default, seq_len),
                       block_k=block_size("block_k", block_k or default, seq_len), alibi=alibi_slopes_H is not None,
                       fused_heads=n_heads == 1 or head_dim % _LANES == 0, interpret=interpret)
    return _attention(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes_H)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes_H):
    return _attention_fwd(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes_H)[0]


def _attention_fwd(cfg, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes_H):
    q, k, v = (_to_kernel_layout(cfg, x) for x in (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK))
    group = q_BxLxHxK.shape[2] // k_BxLxGxK.shape[2]
    out, lse_BxHx1xL = _forward(cfg, group, q, k, v, slopes_H, q_BxLxHxK.shape)
    out_BxLxHxK = _from_kernel_layout(cfg, out, q_BxLxHxK.shape)
    # named for the remat policies that keep the attention (`transformer.REMAT_POLICIES`)
    out_BxLxHxK, lse_BxHx1xL = checkpoint_name(out_BxLxHxK, "context"), checkpoint_name(lse_BxHx1xL, "context_lse")
    return out_BxLxHxK, (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes_H, out_BxLxHxK, lse_BxHx1xL)


def _attention_bwd(cfg, residuals, dout_BxLxHxK):
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, slopes_H, out_BxLxHxK, lse_BxHx1xL = residuals
    dout_BxLxHxK = dout_BxLxHxK.astype(out_BxLxHxK.dtype)
    d_BxHx1xL = jnp.einsum("blhk,blhk->bhl", dout_BxLxHxK.astype(jnp.float32),
                           out_BxLxHxK.astype(jnp.float32))[:, :, None, :]
    q, k, v, dout = (_to_kernel_layout(cfg, x) for x in (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, dout_BxLxHxK))
    shape = q_BxLxHxK.shape
    group = shape[2] // k_BxLxGxK.shape[2]
    dq = _backward_dq(cfg, group, q, k, v, dout, lse_BxHx1xL, d_BxHx1xL, slopes_H, shape)
    dk, dv = _backward_dkv(cfg, group, q, k, v, dout, lse_BxHx1xL, d_BxHx1xL, slopes_H, shape)
    dq_BxLxHxK = _from_kernel_layout(cfg, dq, shape)
    if group == 1:
        dk_BxLxGxK, dv_BxLxGxK = (_from_kernel_layout(cfg, g, shape) for g in (dk, dv))
    else:  # float32 shares per query head, summed over each group
        b, l, n_kv_heads, head_dim = k_BxLxGxK.shape
        dk_BxLxGxK, dv_BxLxGxK = (
            _from_kernel_layout(cfg, g, shape).reshape(b, l, n_kv_heads, group, head_dim).sum(axis=3).astype(x.dtype)
            for g, x in ((dk, k_BxLxGxK), (dv, v_BxLxGxK)))
    return dq_BxLxHxK, dk_BxLxGxK, dv_BxLxGxK, jnp.zeros_like(slopes_H)  # the slopes are constants of the model


_attention.defvjp(_attention_fwd, _attention_bwd)


# ---------------------------------------------------------------------------------------------------------
# Layout, block specs and the causal block tables.


def _to_kernel_layout(cfg, x_BxLxHxK):
    b, l, h, k = x_BxLxHxK.shape
    return x_BxLxHxK.reshape(b, l, h * k) if cfg.fused_heads else x_BxLxHxK.transpose(0, 2, 1, 3)


def _from_kernel_layout(cfg, x, shape):
    return x.reshape(shape) if cfg.fused_heads else x.transpose(0, 2, 1, 3)


def _rows_spec(cfg, block: int, head_dim: int, which: int, group: int = 1):
    """Blocks of `block` sequence positions × one head's features, at the table entry `which` (0: query
    block, 1: key block) of grid step (b, h, t); from head h // group, the key/value head of query head h."""
    def index_map(b, h, t, q_tab, k_tab):
        s = (q_tab, k_tab)[which][t]
        head = h // group
        return (b, s, head) if cfg.fused_heads else (b, head, s, 0)
    block_shape = (None, block, head_dim) if cfg.fused_heads else (None, None, block, head_dim)
    return pl.BlockSpec(block_shape, index_map)


def _row_stats_spec(cfg):
    """A query block's float32 statistics (logsumexp, D) from [B, H, 1, L]: queries along lanes."""
    return pl.BlockSpec((None, None, 1, cfg.block_q), lambda b, h, t, q_tab, k_tab: (b, h, 0, q_tab[t]))


_SMEM_SPEC = pl.BlockSpec(memory_space=pltpu.SMEM)  # the whole slopes_H, as scalars


def _pairs_by_query(cfg, seq_len: int):
    """(query block, key block) pairs with some key j ≤ some query i, key blocks ascending per query block."""
    pairs = [(qi, ki) for qi in range(seq_len // cfg.block_q)
             for ki in range(((qi + 1) * cfg.block_q - 1) // cfg.block_k + 1)]
    return _tables(pairs)


def _pairs_by_key(cfg, seq_len: int):
    """The same pairs, grouped by key block, query blocks ascending from the diagonal."""
    pairs = [(qi, ki) for ki in range(seq_len // cfg.block_k)
             for qi in range(ki * cfg.block_k // cfg.block_q, seq_len // cfg.block_q)]
    return _tables(pairs)


def _tables(pairs):
    q_tab, k_tab = np.asarray(pairs, np.int32).T
    return jnp.asarray(q_tab), jnp.asarray(k_tab)


def _pallas_call(cfg, kernel, shape, tables, in_specs, out_specs, out_shape, scratch_shapes, cost):
    batch, _, n_heads, _ = shape
    grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=(batch, n_heads, tables[0].shape[0]),
                                             in_specs=in_specs, out_specs=out_specs, scratch_shapes=scratch_shapes)
    # The last axis revisits one output block over consecutive steps, so it runs in order.
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))
    return pl.pallas_call(functools.partial(kernel, cfg=cfg), grid_spec=grid_spec, out_shape=out_shape,
                          compiler_params=params, interpret=cfg.interpret, cost_estimate=cost)


def _cost(cfg, shape, tables, itemsize: int, matmuls: int, streamed_rows: int, whole_arrays: int):
    """What a kernel does, for XLA's cost model (which cannot look inside a Pallas call): `matmuls` block
    products and one block of exponentials per grid step; HBM traffic of `streamed_rows` rows of head_dim
    fetched per step, plus `whole_arrays` [L, head_dim] arrays read or written once per head."""
    batch, seq_len, n_heads, head_dim = shape
    steps = batch * n_heads * int(tables[0].shape[0])
    block_elems = cfg.block_q * cfg.block_k
    return pl.CostEstimate(flops=steps * matmuls * 2 * block_elems * head_dim, transcendentals=steps * block_elems,
                           bytes_accessed=itemsize * head_dim * (steps * streamed_rows
                                                                 + batch * n_heads * whole_arrays * seq_len))


def _grid_step(cfg, q_tab, k_tab, slopes_ref):
    """The first query and first key of this grid step's block pair, and its head's ALiBi slope."""
    t = pl.program_id(2)
    return q_tab[t] * cfg.block_q, k_tab[t] * cfg.block_k, slopes_ref[pl.program_id(1)]


def _crosses_diagonal(q_start, k_start, k_len):
    """Whether the block holds a key after a query (j > i), i.e. needs the causal mask."""
    return k_start + k_len - 1 > q_start


def _scores(cfg, x_RxK, y_CxK, slope, q_pos_RxC, k_pos_RxC, masked: bool):
    """scale·x·yᵀ (+ ALiBi) in float32, with −∞ (as MASKED) where the key follows the query if `masked`."""
    s_RxC = lax.dot_general(x_RxK, y_CxK, _NT, preferred_element_type=jnp.float32) * cfg.scale
    if cfg.alibi:
        s_RxC = s_RxC + slope * (k_pos_RxC - q_pos_RxC).astype(jnp.float32)
    if masked:
        s_RxC = jnp.where(k_pos_RxC <= q_pos_RxC, s_RxC, MASKED)
    return s_RxC


def _positions(start, shape, axis):
    return start + lax.broadcasted_iota(jnp.int32, shape, axis)


def _run_masked_or_not(needs_mask, step):
    """step(masked) under pl.when: the mask costs work only on blocks the diagonal crosses."""
    pl.when(needs_mask)(functools.partial(step, True))
    pl.when(jnp.logical_not(needs_mask))(functools.partial(step, False))


# ---------------------------------------------------------------------------------------------------------
# Forward.


def _forward(cfg, group, q, k, v, slopes_H, shape):
    batch, seq_len, n_heads, head_dim = shape
    tables = _pairs_by_query(cfg, seq_len)
    kv_spec = _rows_spec(cfg, cfg.block_k, head_dim, 1, group)
    in_specs = [_SMEM_SPEC, _rows_spec(cfg, cfg.block_q, head_dim, 0), kv_spec, kv_spec]
    out_specs = [_rows_spec(cfg, cfg.block_q, head_dim, 0), _row_stats_spec(cfg)]
    out_shape = [out_like(q, v.dtype),
                 out_like(q, jnp.float32, (batch, n_heads, 1, seq_len))]
    scratch = [pltpu.VMEM((cfg.block_q, 1), jnp.float32), pltpu.VMEM((cfg.block_q, 1), jnp.float32),
               pltpu.VMEM((cfg.block_q, head_dim), jnp.float32)]
    cost = _cost(cfg, shape, tables, q.dtype.itemsize, matmuls=2, streamed_rows=2 * cfg.block_k, whole_arrays=2)
    return _pallas_call(cfg, _forward_kernel, shape, tables, in_specs, out_specs, out_shape, scratch, cost)(
        *tables, slopes_H, q, k, v)


def _forward_kernel(q_tab, k_tab, slopes_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, max_ref, sum_ref, acc_ref,
                    *, cfg):
    """One (query block, key block) step of the online softmax; the last key block of a row writes it out."""
    bq, bk = cfg.block_q, cfg.block_k
    q_start, k_start, slope = _grid_step(cfg, q_tab, k_tab, slopes_ref)

    @pl.when(k_start == 0)
    def _start_row_block():
        max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def step(masked):
        q_pos_QxS = _positions(q_start, (bq, bk), 0)
        k_pos_QxS = _positions(k_start, (bq, bk), 1)
        s_QxS = _scores(cfg, q_ref[...], k_ref[...], slope, q_pos_QxS, k_pos_QxS, masked)
        max_prev_Qx1 = max_ref[...]
        max_Qx1 = jnp.maximum(max_prev_Qx1, jnp.max(s_QxS, axis=1, keepdims=True))
        p_QxS = jnp.exp(s_QxS - max_Qx1)
        rescale_Qx1 = jnp.exp(max_prev_Qx1 - max_Qx1)
        sum_ref[...] = rescale_Qx1 * sum_ref[...] + jnp.sum(p_QxS, axis=1, keepdims=True)
        v_SxK = v_ref[...]
        acc_ref[...] = rescale_Qx1 * acc_ref[...] + jnp.dot(p_QxS.astype(v_SxK.dtype), v_SxK,
                                                            preferred_element_type=jnp.float32)
        max_ref[...] = max_Qx1

    _run_masked_or_not(_crosses_diagonal(q_start, k_start, bk), step)

    # Key block 0 comes first and holds key 0, seen by every query, so the running max is finite here.
    @pl.when(k_start + bk >= q_start + bq)
    def _finish_row_block():
        sum_Qx1 = sum_ref[...]
        out_ref[...] = (acc_ref[...] / sum_Qx1).astype(out_ref.dtype)
        lse_ref[0] = (max_ref[...] + jnp.log(sum_Qx1))[:, 0]


# ---------------------------------------------------------------------------------------------------------
# Backward: dS = P ∘ (dP − D) with P = exp(S − logsumexp), dP = dO·vᵀ, D = rowsum(dO ∘ O).


def _backward_dq(cfg, group, q, k, v, dout, lse_BxHx1xL, d_BxHx1xL, slopes_H, shape):
    _, seq_len, _, head_dim = shape
    tables = _pairs_by_query(cfg, seq_len)
    q_spec, k_spec = _rows_spec(cfg, cfg.block_q, head_dim, 0), _rows_spec(cfg, cfg.block_k, head_dim, 1, group)
    in_specs = [_SMEM_SPEC, q_spec, k_spec, k_spec, q_spec, _row_stats_spec(cfg), _row_stats_spec(cfg)]
    scratch = [pltpu.VMEM((cfg.block_q, head_dim), jnp.float32)]
    cost = _cost(cfg, shape, tables, q.dtype.itemsize, matmuls=3, streamed_rows=2 * cfg.block_k, whole_arrays=3)
    return _pallas_call(cfg, _dq_kernel, shape, tables, in_specs, q_spec, out_like(q, q.dtype),
                        scratch, cost)(*tables, slopes_H, q, k, v, dout, lse_BxHx1xL, d_BxHx1xL)


def _dq_kernel(q_tab, k_tab, slopes_ref, q_ref, k_ref, v_ref, dout_ref, lse_ref, d_ref, dq_ref, dq_acc_ref, *, cfg):
    """dq of one query block, accumulated over its key blocks (queries along rows)."""
    bq, bk = cfg.block_q, cfg.block_k
    q_start, k_start, slope = _grid_step(cfg, q_tab, k_tab, slopes_ref)

    @pl.when(k_start == 0)
    def _start_row_block():
        dq_acc_ref[...] = jnp.zeros(dq_acc_ref.shape, jnp.float32)

    def step(masked):
        q_pos_QxS = _positions(q_start, (bq, bk), 0)
        k_pos_QxS = _positions(k_start, (bq, bk), 1)
        k_SxK = k_ref[...]
        s_QxS = _scores(cfg, q_ref[...], k_SxK, slope, q_pos_QxS, k_pos_QxS, masked)
        p_QxS = jnp.exp(s_QxS - lse_ref[0][:, None])
        dp_QxS = lax.dot_general(dout_ref[...], v_ref[...], _NT, preferred_element_type=jnp.float32)
        ds_QxS = p_QxS * (dp_QxS - d_ref[0][:, None])
        dq_acc_ref[...] += jnp.dot(ds_QxS.astype(k_SxK.dtype), k_SxK, preferred_element_type=jnp.float32)

    _run_masked_or_not(_crosses_diagonal(q_start, k_start, bk), step)

    @pl.when(k_start + bk >= q_start + bq)
    def _finish_row_block():
        dq_ref[...] = (dq_acc_ref[...] * cfg.scale).astype(dq_ref.dtype)


def _backward_dkv(cfg, group, q, k, v, dout, lse_BxHx1xL, d_BxHx1xL, slopes_H, shape):
    """dk and dv; with groups (group > 1), each query head's float32 share of them instead, q-shaped."""
    _, seq_len, _, head_dim = shape
    tables = _pairs_by_key(cfg, seq_len)
    q_spec, k_spec = _rows_spec(cfg, cfg.block_q, head_dim, 0), _rows_spec(cfg, cfg.block_k, head_dim, 1, group)
    in_specs = [_SMEM_SPEC, q_spec, k_spec, k_spec, q_spec, _row_stats_spec(cfg), _row_stats_spec(cfg)]
    if group == 1:
        out_spec, out_shape = k_spec, [out_like(k, k.dtype), out_like(v, v.dtype)]
    else:
        out_spec, out_shape = _rows_spec(cfg, cfg.block_k, head_dim, 1), [out_like(q, jnp.float32)] * 2
    scratch = [pltpu.VMEM((cfg.block_k, head_dim), jnp.float32), pltpu.VMEM((cfg.block_k, head_dim), jnp.float32)]
    kernel = functools.partial(_dkv_kernel, seq_len=seq_len)
    cost = _cost(cfg, shape, tables, q.dtype.itemsize, matmuls=4, streamed_rows=2 * cfg.block_q, whole_arrays=4)
    return _pallas_call(cfg, kernel, shape, tables, in_specs, [out_spec, out_spec], out_shape, scratch, cost)(
        *tables, slopes_H, q, k, v, dout, lse_BxHx1xL, d_BxHx1xL)


def _dkv_kernel(q_tab, k_tab, slopes_ref, q_ref, k_ref, v_ref, dout_ref, lse_ref, d_ref, dk_ref, dv_ref,
                dk_acc_ref, dv_acc_ref, *, cfg, seq_len):
    """dk and dv of one key block, accumulated over its query blocks. Keys along rows (scores transposed),
    so the per-query logsumexp and D broadcast along lanes as stored."""
    bq, bk = cfg.block_q, cfg.block_k
    q_start, k_start, slope = _grid_step(cfg, q_tab, k_tab, slopes_ref)

    @pl.when(q_start == k_start // bq * bq)  # the key block's first query block, on the diagonal
    def _start_key_block():
        dk_acc_ref[...] = jnp.zeros(dk_acc_ref.shape, jnp.float32)
        dv_acc_ref[...] = jnp.zeros(dv_acc_ref.shape, jnp.float32)

    def step(masked):
        k_pos_SxQ = _positions(k_start, (bk, bq), 0)
        q_pos_SxQ = _positions(q_start, (bk, bq), 1)
        q_QxK, dout_QxK = q_ref[...], dout_ref[...]
        s_SxQ = _scores(cfg, k_ref[...], q_QxK, slope, q_pos_SxQ, k_pos_SxQ, masked)
        p_SxQ = jnp.exp(s_SxQ - lse_ref[...])
        dv_acc_ref[...] += jnp.dot(p_SxQ.astype(dout_QxK.dtype), dout_QxK, preferred_element_type=jnp.float32)
        dp_SxQ = lax.dot_general(v_ref[...], dout_QxK, _NT, preferred_element_type=jnp.float32)
        ds_SxQ = p_SxQ * (dp_SxQ - d_ref[...])
        dk_acc_ref[...] += jnp.dot(ds_SxQ.astype(q_QxK.dtype), q_QxK, preferred_element_type=jnp.float32)

    _run_masked_or_not(_crosses_diagonal(q_start, k_start, bk), step)

    @pl.when(q_start + bq == seq_len)
    def _finish_key_block():
        dk_ref[...] = (dk_acc_ref[...] * cfg.scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc_ref[...].astype(dv_ref.dtype)
