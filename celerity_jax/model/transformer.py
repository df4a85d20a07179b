"""Decoder-only transformer in Flax linen, used through `init_params` and `apply` on plain pytrees.

Shapes: B batch, L sequence, D d_model, H heads, K head_dim, F MLP width, V vocab, N layers. A block's MLP is
dense, or with ModelConfig.n_experts > 1 a mixture of experts (`moe`).
Parameters are float32; matmuls run in cfg.dtype (compute_dtype with "auto" resolved), the residual stream in
cfg.residual (residual_dtype resolved); norms, softmax and logits stay float32. Initial std, LR and eps per
parameter come from `completep`.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import flax.linen as nn
from jax.ad_checkpoint import checkpoint_name

from celerity_jax.errors import ConfigError
from celerity_jax.model import (attention, completep, flash_attention, flash_attention_gpu, loss, matmul, positions,
                                sharding)
from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.moe import MixtureOfExperts
from celerity_jax.model.params import UNIT_NORMAL, declarations_of, declare


# What each ModelConfig.remat but "none" keeps for the backward pass; a block recomputes the rest from its input.
# The names are `checkpoint_name`s: q, k, v (after RoPE), the attention's output ("context", before the o
# projection, with the flash kernels' logsumexp "context_lse", so that their backward pass does not rerun the
# forward kernel) and the o projection's output ("attention_out"). MaxText's closest policies: "dots" is its
# 'minimal', "attention" its 'save_dot_except_mlp' (which recomputes the attention itself), "qkv" its
# 'save_qkv_proj', "full" its 'full'.
REMAT_POLICIES = {
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # every projection; attention recomputed
    "attention": jax.checkpoint_policies.save_only_these_names("q", "k", "v", "context", "context_lse",
                                                                "attention_out"),  # the MLP recomputed
    "qkv": jax.checkpoint_policies.save_only_these_names("q", "k", "v"),
    "full": None,  # nothing but the block's input
}


class KVCache(NamedTuple):
    """Keys and values of every layer for S positions of each row (slot j holds position j) and each of the G
    key/value heads, in the compute dtype. Decoding writes the new tokens' keys and values at their positions and
    attends over the slots up to them."""
    k_NxBxSxGxK: jax.Array
    v_NxBxSxGxK: jax.Array


def init_cache(cfg: ModelConfig, batch: int, slots: int) -> KVCache:
    """An empty cache of `slots` positions (at most max_seq_len) for `batch` rows."""
    shape = (cfg.n_layers, batch, slots, cfg.kv_heads, cfg.head_dim)
    return KVCache(jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype))


class Norm(nn.Module):
    cfg: ModelConfig
    role: Role = Role.BLOCK_VECTOR

    @nn.compact
    def __call__(self, x_BxLxD):
        cfg = self.cfg
        x = x_BxLxD.astype(jnp.float32)
        if cfg.norm == "layernorm":
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + cfg.norm_eps)
        x = x * self.param("scale", declare(nn.initializers.ones, self.role, ("norm",)), (x.shape[-1],))
        if cfg.norm == "layernorm" and cfg.use_bias:
            x = x + self.param("bias", declare(nn.initializers.zeros, self.role, ("norm",)), (x.shape[-1],))
        return x.astype(cfg.dtype)


def _dense(cfg: ModelConfig, features: int, name: str, axes: tuple[str, str], fold: str | None = None) -> nn.Dense:
    """A projection whose kernel has the logical axes `axes` (in, out) and whose bias has the output axis."""
    dot_general = matmul.transposed_grad_dot_general if cfg.dense_backward_kernel == "transposed" else None
    return nn.Dense(features, use_bias=cfg.use_bias, kernel_init=declare(UNIT_NORMAL, Role.HIDDEN, axes, fold),
                    bias_init=declare(nn.initializers.zeros, Role.BLOCK_VECTOR, axes[1:], fold), dtype=cfg.dtype,
                    param_dtype=jnp.float32, dot_general=dot_general, name=name)


class Attention(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD, cached=None):
        """The attention branch. With `cached` = (k_BxSxGxK, v_BxSxGxK, positions_BxL): the tokens sit at those
        positions, their keys and values are written into the cache, and the queries attend over it; returns
        (out, (k, v)) then."""
        cfg = self.cfg
        b, l, d = x_BxLxD.shape
        q_BxLxHxK = _dense(cfg, cfg.n_heads * cfg.head_dim, "q", ("embed", "heads"), "query")(x_BxLxD).reshape(
            b, l, cfg.n_heads, cfg.head_dim)
        k_BxLxGxK, v_BxLxGxK = (_dense(cfg, cfg.kv_heads * cfg.head_dim, name, ("embed", "kv_heads"))(x_BxLxD)
                                .reshape(b, l, cfg.kv_heads, cfg.head_dim) for name in ("k", "v"))
        scale = completep.forward_multipliers(cfg)["attention"]
        positions_BxL = None if cached is None else cached[2]
        if cfg.positions == "rope":
            q_BxLxHxK = positions.apply_rope(q_BxLxHxK, cfg.rope_theta, positions_BxL)
            k_BxLxGxK = positions.apply_rope(k_BxLxGxK, cfg.rope_theta, positions_BxL)
        q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = (checkpoint_name(t, name) for t, name in
                                           ((q_BxLxHxK, "q"), (k_BxLxGxK, "k"), (v_BxLxGxK, "v")))
        slopes_H = positions.alibi_slopes(cfg.n_heads) if cfg.positions == "alibi" else None
        o = _dense(cfg, d, "o", ("heads", "embed"), "residual")
        if cached is not None:
            rows_Bx1 = jnp.arange(b)[:, None]
            k_BxSxGxK = cached[0].at[rows_Bx1, positions_BxL].set(k_BxLxGxK.astype(cached[0].dtype), mode="drop")
            v_BxSxGxK = cached[1].at[rows_Bx1, positions_BxL].set(v_BxLxGxK.astype(cached[1].dtype), mode="drop")
            out_BxLxHxK = attention.cached_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, positions_BxL, scale=scale,
                                                     alibi_slopes_H=slopes_H)
            return o(out_BxLxHxK.reshape(b, l, cfg.n_heads * cfg.head_dim)), (k_BxSxGxK, v_BxSxGxK)
        if cfg.attention_kernel == "blocked":
            out_BxLxHxK = attention.causal_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, scale=scale,
                                                     alibi_slopes_H=slopes_H)
        elif cfg.attention_kernel == "flash":
            out_BxLxHxK = platform_flash_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, scale=scale,
                                                   alibi_slopes_H=slopes_H)
        else:
            bias = None
            if cfg.positions == "alibi":
                bias = positions.alibi_bias(cfg.n_heads, l)
                if cfg.attention_kernel == "cudnn":  # the fused kernel wants the bias in the input dtype
                    bias = bias.astype(q_BxLxHxK.dtype)
            out_BxLxHxK = jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, bias=bias, is_causal=True,
                                                       scale=scale, implementation=cfg.attention_kernel)
        out_BxLxHxK = checkpoint_name(out_BxLxHxK, "context")
        return checkpoint_name(o(out_BxLxHxK.reshape(b, l, cfg.n_heads * cfg.head_dim)), "attention_out")


def platform_flash_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *, scale: float, alibi_slopes_H):
    """The Pallas flash kernel of the platform the program is lowered for (also when compiled ahead of time from
    another host): Mosaic on a TPU, Triton on an NVIDIA GPU, the TPU kernel in the Pallas interpreter elsewhere
    (tests). It runs shard by shard under the mesh being traced, since XLA cannot partition a Pallas call."""
    def attend(kernel, interpret: bool = False):
        def run(q, k, v, *slopes):
            return kernel(q, k, v, scale=scale, alibi_slopes_H=slopes[0] if slopes else None, interpret=interpret)
        return run

    def on_this_platform(q, k, v, *slopes):
        return jax.lax.platform_dependent(
            q, k, v, *slopes, tpu=attend(flash_attention.flash_attention),
            cuda=attend(flash_attention_gpu.flash_attention_gpu),
            default=attend(flash_attention.flash_attention, interpret=True))

    per_head = () if alibi_slopes_H is None else (jnp.asarray(alibi_slopes_H, jnp.float32),)
    return sharding.map_over_batch_and_heads(on_this_platform, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *per_head)


# The activation of each ungated ModelConfig.mlp (see its docstring; "swiglu" gates instead). "gelu" is the exact
# x·Φ(x), as PyTorch's default nn.GELU; "gelu_tanh" is the tanh approximation (jax.nn.gelu's default).
ACTIVATIONS = {
    "squared_relu": lambda h: jnp.square(jax.nn.relu(h)),
    "gelu": lambda h: jax.nn.gelu(h, approximate=False),
    "gelu_tanh": lambda h: jax.nn.gelu(h, approximate=True),
}


class Mlp(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD):
        cfg = self.cfg
        h_BxLxF = _dense(cfg, cfg.d_ff, "up", ("embed", "mlp"))(x_BxLxD)
        if cfg.mlp == "swiglu":
            h_BxLxF = jax.nn.silu(_dense(cfg, cfg.d_ff, "gate", ("embed", "mlp"))(x_BxLxD)) * h_BxLxF
        else:
            h_BxLxF = ACTIVATIONS[cfg.mlp](h_BxLxF)
        return _dense(cfg, x_BxLxD.shape[-1], "down", ("mlp", "embed"), "residual")(h_BxLxF)


class Block(nn.Module):
    """Pre-norm block x ← x + r·Attn(Norm x); x ← x + r·MLP(Norm x), r = m_L^(−α); the MLP a mixture of experts
    when ModelConfig.n_experts > 1 (the hash router reads the tokens).
    Returns the new residual stream and the layer's stats: residual_rms (for the coordinate check) and a mixture's
    router stats; with `cached` (see Attention), also the layer's updated keys and values."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD, tokens_BxL, cached=None):
        cfg = self.cfg
        r = completep.forward_multipliers(cfg)["residual"]
        x_BxLxD = sharding.constrain_residual(x_BxLxD)
        attn_BxLxD = Attention(cfg, name="attn")(Norm(cfg, name="attn_norm")(x_BxLxD), cached)
        if cached is not None:
            attn_BxLxD, kv = attn_BxLxD
        x_BxLxD = sharding.constrain_residual(x_BxLxD + r * attn_BxLxD.astype(cfg.residual))
        h_BxLxD = Norm(cfg, name="mlp_norm")(x_BxLxD)
        if cfg.n_experts == 1:
            mlp_BxLxD, stats = Mlp(cfg, name="mlp")(h_BxLxD), {}
        else:
            mlp_BxLxD, stats = MixtureOfExperts(cfg, Mlp, name="mlp")(h_BxLxD, tokens_BxL)
        x_BxLxD = sharding.constrain_residual(x_BxLxD + r * mlp_BxLxD.astype(cfg.residual))
        stats = {"residual_rms": _rms(x_BxLxD), **stats}
        return (x_BxLxD, stats) if cached is None else (x_BxLxD, stats, kv)


class Transformer(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens_BxL, *, unembed: bool = True, cache: KVCache | None = None, positions_BxL=None):
        """(logits_BxLxV, stats); with unembed=False, (final hidden states x_BxLxD, unembed_DxV, stats).

        With a `cache` (unscanned layers only), the tokens sit at positions_BxL, their keys and values go into
        the cache, and the result is (logits_BxLxV, the updated cache)."""
        cfg = self.cfg
        mult = completep.forward_multipliers(cfg)
        embed_VxD = self.param("embed", declare(UNIT_NORMAL, Role.EMBEDDING, ("vocab", "embed"), "input"),
                               (cfg.vocab_size, cfg.d_model))
        x_BxLxD = jnp.take(embed_VxD, tokens_BxL, axis=0)
        if cfg.positions == "learned":
            pos_LxD = self.param("pos_embed", declare(UNIT_NORMAL, Role.EMBEDDING, ("position", "embed"), "input"),
                                 (cfg.max_seq_len, cfg.d_model))
            x_BxLxD = x_BxLxD + (pos_LxD[None, : tokens_BxL.shape[1]] if cache is None
                                 else jnp.take(pos_LxD, positions_BxL, axis=0))
        x_BxLxD = sharding.constrain_residual((x_BxLxD * mult["input"]).astype(cfg.residual))
        stats = {"embed_rms": _rms(x_BxLxD)}

        block = Block
        if cache is not None:
            if cfg.scan_layers:
                raise ConfigError("a KV cache needs unscanned layers; load the parameters with "
                                  "`unstack_layers` and ModelConfig.scan_layers = False")
            k, v = [], []
            for i in range(cfg.n_layers):
                x_BxLxD, _, (k_i, v_i) = block(cfg, name=f"block_{i}")(
                    x_BxLxD, tokens_BxL, (cache.k_NxBxSxGxK[i], cache.v_NxBxSxGxK[i], positions_BxL))
                k.append(k_i)
                v.append(v_i)
            cache = KVCache(jnp.stack(k), jnp.stack(v))
        else:
            if cfg.remat != "none":
                block = nn.remat(Block, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)
            if cfg.scan_layers:
                scanned = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                                  in_axes=nn.broadcast, length=cfg.n_layers)
                x_BxLxD, layer_stats_N = scanned(cfg, name="blocks")(x_BxLxD, tokens_BxL)
            else:
                layer_stats = []
                for i in range(cfg.n_layers):
                    x_BxLxD, stats_i = block(cfg, name=f"block_{i}")(x_BxLxD, tokens_BxL)
                    layer_stats.append(stats_i)
                layer_stats_N = jax.tree.map(lambda *per_layer: jnp.stack(per_layer), *layer_stats)
            stats.update(layer_stats_N)

        x_BxLxD = Norm(cfg, Role.FINAL_NORM, name="final_norm")(x_BxLxD)
        if cfg.tie_embeddings:
            unembed_DxV = embed_VxD.T
        else:
            unembed_DxV = self.param("unembed", declare(UNIT_NORMAL, Role.UNEMBEDDING, ("embed", "vocab"), "output"),
                                     (cfg.d_model, cfg.vocab_size))
        if not unembed:
            return x_BxLxD, unembed_DxV, stats
        logits_BxLxV = jnp.dot(x_BxLxD, unembed_DxV.astype(cfg.dtype),
                               preferred_element_type=jnp.float32) * mult["output"]
        if cache is not None:
            return logits_BxLxV, cache
        stats["logits_rms"] = _rms(logits_BxLxV)
        return logits_BxLxV, stats


def _rms(x) -> jnp.ndarray:
    return jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))


def _init_boxed(cfg: ModelConfig, rng: jax.Array) -> dict:
    return Transformer(cfg).init(rng, jnp.zeros((1, 1), jnp.int32))["params"]


@functools.cache
def declarations(cfg: ModelConfig) -> dict:
    """The `params.Declaration` of every parameter, in a tree mirroring `init_params(cfg, ...)` (nothing is
    allocated)."""
    return declarations_of(jax.eval_shape(lambda: _init_boxed(cfg, jax.random.key(0))))


@functools.partial(jax.jit, static_argnums=0)
def init_params(cfg: ModelConfig, rng: jax.Array) -> dict:
    """Float32 parameters with the per-role init std of `completep.multipliers`."""
    raw = nn.meta.unbox(_init_boxed(cfg, rng))
    stds = completep.multipliers(cfg, declarations(cfg)).init_std
    return jax.tree.map(lambda p, std: p * std if std > 0 else p, raw, stds)


@functools.partial(jax.jit, static_argnums=0, static_argnames="return_stats")
def apply(cfg: ModelConfig, params: dict, tokens_BxL: jax.Array, *, return_stats: bool = False):
    """Float32 logits_BxLxV of the next token at every position.

    With return_stats, also a dict of RMS values: embed_rms, residual_rms (one per layer), logits_rms; and with
    n_experts > 1 each layer's router stats (`MixtureOfExperts`).
    """
    _check_tokens(cfg, tokens_BxL)
    logits_BxLxV, stats = Transformer(cfg).apply({"params": params}, tokens_BxL)
    return (logits_BxLxV, stats) if return_stats else logits_BxLxV


def apply_cached(cfg: ModelConfig, params: dict, tokens_BxL: jax.Array, cache: KVCache,
                 positions_BxL: jax.Array) -> tuple[jax.Array, KVCache]:
    """Float32 logits_BxLxV of the tokens at positions_BxL, attending over the cache, and the cache with their
    keys and values written in (unscanned layers: see `unstack_layers`). Traced inside the caller's jit."""
    return Transformer(cfg).apply({"params": params}, tokens_BxL, cache=cache, positions_BxL=positions_BxL)


def unstack_layers(cfg: ModelConfig, params: dict) -> tuple[ModelConfig, dict]:
    """The same model with one parameter subtree per layer (block_<i>) instead of scanned `blocks` stacked on a
    leading layer axis; unchanged when the layers are not scanned."""
    if not cfg.scan_layers:
        return cfg, params
    out = {k: v for k, v in params.items() if k != "blocks"}
    for i in range(cfg.n_layers):
        out[f"block_{i}"] = jax.tree.map(lambda x: x[i], params["blocks"])
    return dataclasses.replace(cfg, scan_layers=False), out


@functools.partial(jax.jit, static_argnums=0, static_argnames=("z_loss", "loss_unroll"))
def next_token_loss(cfg: ModelConfig, params: dict, inputs_BxL: jax.Array, targets_BxL: jax.Array, *,
                    z_loss: float = 0.0, loss_unroll: int = 1) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`loss.cross_entropy` of the model's logits, computed in chunks of ModelConfig.logits_chunk_len positions
    when that asks for chunks (the logits then never exist whole); loss_unroll: chunks per iteration of its loop.
    A mixture of experts adds its router's terms (`_with_router_terms`)."""
    _check_tokens(cfg, inputs_BxL)
    batch, seq_len = inputs_BxL.shape
    chunk_len = loss.logits_chunk_len(cfg.logits_chunk_len, sharding.local_batch(batch), seq_len, cfg.vocab_size)
    if chunk_len == seq_len:
        logits_BxLxV, stats = Transformer(cfg).apply({"params": params}, inputs_BxL)
        total, terms = loss.cross_entropy(logits_BxLxV, targets_BxL, z_loss)
    else:
        x_BxLxD, unembed_DxV, stats = Transformer(cfg).apply({"params": params}, inputs_BxL, unembed=False)
        total, terms = loss.chunked_cross_entropy(
            x_BxLxD, unembed_DxV, targets_BxL, chunk_len=chunk_len, z_loss=z_loss,
            logit_scale=completep.forward_multipliers(cfg)["output"], unroll=loss_unroll)
    return _with_router_terms(cfg, total, terms, stats)


def _with_router_terms(cfg: ModelConfig, total, terms: dict, stats: dict) -> tuple[jax.Array, dict]:
    """With n_experts > 1: terms gain the layers' mean dropped fraction and their expert_load (N × E); a top-k
    router's load-balancing loss, averaged over the layers (router_aux), is added to the total × router_aux_coef.
    A dense model's total and terms are returned as they are."""
    if cfg.n_experts == 1:
        return total, terms
    terms = {**terms, "dropped": jnp.mean(stats["dropped"]), "expert_load": stats["expert_load"]}
    if cfg.router == "topk":
        terms["router_aux"] = jnp.mean(stats["router_aux"])
        total = total + cfg.router_aux_coef * terms["router_aux"]
    return total, terms


def _check_tokens(cfg: ModelConfig, tokens_BxL: jax.Array) -> None:
    if tokens_BxL.ndim != 2 or tokens_BxL.shape[1] > cfg.max_seq_len:
        raise ConfigError(f"tokens of shape {tokens_BxL.shape} do not fit ModelConfig.max_seq_len="
                          f"{cfg.max_seq_len}; pass [batch, length] with length <= max_seq_len")
