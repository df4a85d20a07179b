"""What the TPU (`flash_attention.py`) and GPU (`flash_attention_gpu.py`) flash-attention kernels share: the
static settings of a call, the checks of its arguments, and the output spec under shard_map."""

import dataclasses

import jax
import jax.numpy as jnp

MASKED = -1e30  # a finite "minus infinity": exp(MASKED − max) is exactly 0 in float32


def checked_slopes(q_BxLxHxK, alibi_slopes_H) -> jax.Array:
    """The slopes as float32 [H] (zeros, read by no kernel, without ALiBi), after checking that there is one per
    query head of q (whose shape against k and v `attention.kv_group_size` checks)."""
    n_heads = q_BxLxHxK.shape[2]
    if alibi_slopes_H is None:
        return jnp.zeros((n_heads,), jnp.float32)
    slopes_H = jnp.asarray(alibi_slopes_H, jnp.float32)
    if slopes_H.shape != (n_heads,):
        raise ValueError(f"alibi_slopes_H has shape {slopes_H.shape}; expected ({n_heads},), one per head")
    return slopes_H


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """The static settings of one attention call (the GPU kernels ignore fused_heads)."""
    scale: float
    block_q: int
    block_k: int
    alibi: bool
    interpret: bool
    fused_heads: bool = False  # TPU kernels read [B, L, H·K] (else [B, H, L, K])


def block_size(name: str, block: int, seq_len: int) -> int:
    """`block` clamped to the sequence length; ValueError unless it then divides it."""
    block = min(block, seq_len)
    if block <= 0 or seq_len % block:
        raise ValueError(f"{name}={block} does not divide the sequence length {seq_len}; pass a {name} that "
                         f"divides it (e.g. a power of two dividing {seq_len}), or pad the sequence")
    return block


def out_like(x, dtype, shape=None):
    """An output spec varying over the same shard_map axes as x (which check_vma asks of outputs)."""
    return jax.ShapeDtypeStruct(x.shape if shape is None else shape, dtype, manual_axis_type=jax.typeof(x).mat)
