"""Next-token cross-entropy with an optional z-loss (PaLM), computed in float32: from whole logits, or chunk by
chunk from the final hidden states so that the B×L×V logits never exist at once."""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from celerity_jax.errors import ConfigError
from celerity_jax.model import sharding

# "auto" chunks the loss when one microbatch's float32 logits on one chip would exceed this.
LOGITS_BUDGET_BYTES = 256 * 2**20
_MIN_AUTO_CHUNK = 128  # below this many positions per chunk the unembedding matmuls get thin


def cross_entropy(logits_BxLxV: jax.Array, targets_BxL: jax.Array,
                  z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean over tokens of −log p(target) + z_loss·(log Z)²; aux holds both terms separately."""
    logits_BxLxV = logits_BxLxV.astype(jnp.float32)
    log_z_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
    target_logit_BxL = jnp.take_along_axis(logits_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
    ce = jnp.mean(log_z_BxL - target_logit_BxL)
    z_term = jnp.mean(jnp.square(log_z_BxL))
    return ce + z_loss * z_term, {"cross_entropy": ce, "z_loss": z_term}


def logits_chunk_len(setting: int | str, local_seqs: int, seq_len: int, vocab_size: int) -> int:
    """Sequence positions per loss chunk (seq_len: no chunking), for ModelConfig.logits_chunk_len.

    "auto": the whole sequence while one chip's float32 logits (local_seqs × seq_len × vocab_size) fit in
    LOGITS_BUDGET_BYTES, else the longest divisor of seq_len that fits (at least 128 positions where seq_len has
    such a divisor). 0: never chunk. A positive setting must divide seq_len."""
    if setting == "auto":
        bytes_per_position = 4 * local_seqs * vocab_size
        if seq_len * bytes_per_position <= LOGITS_BUDGET_BYTES:
            return seq_len
        longest = max(LOGITS_BUDGET_BYTES // bytes_per_position, min(_MIN_AUTO_CHUNK, seq_len))
        return max(d for d in range(1, seq_len + 1) if seq_len % d == 0 and d <= longest)
    if setting == 0:
        return seq_len
    if seq_len % setting:
        raise ConfigError(f"ModelConfig.logits_chunk_len={setting} does not divide the sequence length "
                          f"{seq_len}; choose a divisor of {seq_len}, 0 (no chunking) or 'auto'")
    return setting


def chunked_cross_entropy(x_BxLxD: jax.Array, unembed_DxV: jax.Array, targets_BxL: jax.Array, *,
                          logit_scale: float, chunk_len: int, z_loss: float = 0.0,
                          unroll: int = 1) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`cross_entropy` of the logits (x·unembed in x's dtype, float32 accumulation)·logit_scale, computed over
    chunks of `chunk_len` positions so that only B × chunk_len × V logits exist at a time.

    Its gradient is computed in the same pass over the chunks (the loss is a scalar, so the gradient is the
    cotangent times a fixed vector): three matmuls per chunk as in plain autodiff, none recomputed. Only the
    total is differentiable; the two terms in aux are reported without a gradient. unroll: chunks per iteration of
    the loop over them (`lax.scan`'s unroll; for XLA's cost analysis, which counts a loop's body once).
    """
    if x_BxLxD.shape[1] % chunk_len:
        raise ConfigError(f"ModelConfig.logits_chunk_len={chunk_len} does not divide the sequence length "
                          f"{x_BxLxD.shape[1]}; choose a divisor of it, 0 (no chunking) or 'auto'")
    total, ce, z_term = _chunked(float(logit_scale), float(z_loss), chunk_len, int(unroll), x_BxLxD, unembed_DxV,
                                 targets_BxL)
    return total, {"cross_entropy": lax.stop_gradient(ce), "z_loss": lax.stop_gradient(z_term)}


def by_chunk(chunk_len: int, x_BxL):
    """[B, L, ...] -> [L / chunk_len, B, chunk_len, ...]: the batch axis keeps its sharding."""
    b, l = x_BxL.shape[:2]
    return x_BxL.reshape(b, l // chunk_len, chunk_len, *x_BxL.shape[2:]).swapaxes(0, 1)


def _chunk_terms(logit_scale, x_BxCxD, unembed_DxV, targets_BxC):
    """Float32 logits of one chunk, their log Z, and the sums of (log Z − target logit) and of (log Z)²."""
    logits_BxCxV = jnp.dot(x_BxCxD, unembed_DxV.astype(x_BxCxD.dtype),
                           preferred_element_type=jnp.float32) * logit_scale
    log_z_BxC = jax.nn.logsumexp(logits_BxCxV, axis=-1)
    target_logit_BxC = jnp.take_along_axis(logits_BxCxV, targets_BxC[..., None], axis=-1)[..., 0]
    return logits_BxCxV, log_z_BxC, jnp.sum(log_z_BxC - target_logit_BxC), jnp.sum(jnp.square(log_z_BxC))


def _totals(z_loss, n_tokens, ce_sum, z_sum):
    ce, z_term = ce_sum / n_tokens, z_sum / n_tokens
    return ce + z_loss * z_term, ce, z_term


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _chunked(logit_scale, z_loss, chunk_len, unroll, x_BxLxD, unembed_DxV, targets_BxL):
    w_DxV = sharding.constrain_vocab_split(unembed_DxV.astype(x_BxLxD.dtype))

    def body(sums, chunk):
        x_BxCxD, targets_BxC = chunk
        _, _, ce_sum, z_sum = _chunk_terms(logit_scale, x_BxCxD, w_DxV, targets_BxC)
        return (sums[0] + ce_sum, sums[1] + z_sum), None

    zero = jnp.zeros([], jnp.float32)
    chunks = (by_chunk(chunk_len, x_BxLxD), by_chunk(chunk_len, targets_BxL))
    (ce_sum, z_sum), _ = lax.scan(body, (zero, zero), chunks, unroll=unroll)
    return _totals(z_loss, targets_BxL.size, ce_sum, z_sum)


def _chunked_fwd(logit_scale, z_loss, chunk_len, unroll, x_BxLxD, unembed_DxV, targets_BxL):
    n_tokens = targets_BxL.size
    w_DxV = sharding.constrain_vocab_split(unembed_DxV.astype(x_BxLxD.dtype))
    # The unembedding's gradient is summed over the batch, which is split over the chips: each batch shard keeps
    # its own partial sum over the chunks (S of them, one per shard), and they are added up once at the end,
    # not reduced across chips in every chunk.
    batch, shards = x_BxLxD.shape[0], sharding.traced_batch_shards()
    shards = shards if batch % shards == 0 else 1

    def by_shard(x_BxCx_):
        return sharding.constrain_batch(x_BxCx_.reshape(shards, batch // shards, *x_BxCx_.shape[1:]))

    def body(carry, chunk):
        ce_sum, z_sum, dw_SxDxV = carry
        x_BxCxD, targets_BxC = chunk
        logits_BxCxV, log_z_BxC, ce_part, z_part = _chunk_terms(logit_scale, x_BxCxD, w_DxV, targets_BxC)
        # d(total)/d(logits) = (softmax − onehot(target) + 2·z_loss·log Z·softmax) / n_tokens
        p_BxCxV = jnp.exp(logits_BxCxV - log_z_BxC[..., None])
        onehot_BxCxV = lax.broadcasted_iota(jnp.int32, logits_BxCxV.shape, 2) == targets_BxC[..., None]
        dlogits_BxCxV = p_BxCxV * (1.0 + 2.0 * z_loss * log_z_BxC[..., None]) - onehot_BxCxV
        dlogits_BxCxV = (dlogits_BxCxV * (logit_scale / n_tokens)).astype(x_BxCxD.dtype)
        dx_BxCxD = jnp.einsum("bcv,dv->bcd", dlogits_BxCxV, w_DxV,
                              preferred_element_type=jnp.float32).astype(x_BxCxD.dtype)
        dw_SxDxV = dw_SxDxV + jnp.einsum("sbcd,sbcv->sdv", by_shard(x_BxCxD), by_shard(dlogits_BxCxV),
                                         preferred_element_type=jnp.float32)
        return (ce_sum + ce_part, z_sum + z_part, dw_SxDxV), dx_BxCxD

    zero = jnp.zeros([], jnp.float32)
    chunks = (by_chunk(chunk_len, x_BxLxD), by_chunk(chunk_len, targets_BxL))
    init = (zero, zero, sharding.constrain_batch(jnp.zeros((shards, *unembed_DxV.shape), jnp.float32)))
    (ce_sum, z_sum, dw_SxDxV), dx_NxBxCxD = lax.scan(body, init, chunks, unroll=unroll)
    dx_BxLxD = dx_NxBxCxD.swapaxes(0, 1).reshape(x_BxLxD.shape)
    dunembed_DxV = jnp.sum(dw_SxDxV, axis=0).astype(unembed_DxV.dtype)
    return _totals(z_loss, n_tokens, ce_sum, z_sum), (dx_BxLxD, dunembed_DxV, targets_BxL)


def _chunked_bwd(logit_scale, z_loss, chunk_len, unroll, residuals, cotangents):
    dx_BxLxD, dunembed_DxV, targets_BxL = residuals
    dtotal = cotangents[0]  # the terms' cotangents are zero: the public function stops their gradient
    zero_targets = jnp.zeros(targets_BxL.shape, jax.dtypes.float0)
    return (dtotal * dx_BxLxD).astype(dx_BxLxD.dtype), dtotal * dunembed_DxV, zero_targets


_chunked.defvjp(_chunked_fwd, _chunked_bwd)
