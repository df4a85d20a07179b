"""A mixture of experts: the MLP branch of a block as n_experts MLPs, each token routed to some of them.

Shapes: B sequences (or groups of positions), L positions, D d_model, E experts, R experts per token (routes), C
expert capacity (routes an expert takes from a group). docs/moe.md describes what is computed and why.
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from celerity_jax.model import sharding
from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.params import EXPERT, UNIT_NORMAL, declare


def token_hash(tokens_BxL: jax.Array) -> jax.Array:
    """A fixed hash of token ids: the upper 16 of the 32 bits of Knuth's multiplicative hash, which spreads
    neighbouring ids apart."""
    return (tokens_BxL.astype(jnp.uint32) * jnp.uint32(2654435761)) >> 16


def expert_group_len(cfg: ModelConfig, seq_len: int) -> int:
    """G: the positions a mixture dispatches together in a sequence of seq_len, ModelConfig.expert_group_len where
    it divides seq_len (`recipe.make_plan` requires that of training's), else the whole sequence."""
    g = cfg.expert_group_len
    return g if g is not None and seq_len % g == 0 else seq_len


def expert_capacity(cfg: ModelConfig, seq_len: int) -> int:
    """C: the most routes an expert takes from a group of seq_len positions, capacity_factor × its even share of the
    group's seq_len·experts_per_token routes; at most seq_len, since a token never takes one expert twice (and
    seq_len with capacity_factor None)."""
    if cfg.capacity_factor is None:
        return seq_len
    share = cfg.capacity_factor * seq_len * cfg.experts_per_token / cfg.n_experts
    return min(seq_len, max(1, math.ceil(share)))


class MixtureOfExperts(nn.Module):
    """The MLP branch as n_experts copies of `expert` (the model's MLP module, of kind ModelConfig.mlp), their
    weights stacked on a leading EXPERT axis.

    Each group of `expert_group_len` positions is dispatched on its own (below, B counts groups and L their
    positions), its routes taken in order of position and then of rank: whether a token's route is dropped
    depends on the tokens before it only, so the model stays causal. Each expert's weights
    take the dense MLP's role (same fan-in); the router its own, `completep.Role.ROUTER`. With
    ModelConfig.expert_parallel the experts are split over the fsdp mesh axis (`sharding.LOGICAL_RULES`)."""

    cfg: ModelConfig
    expert: Any

    @nn.compact
    def __call__(self, x_BxLxD, tokens_BxL):
        """(the branch's output, stats): stats hold expert_load (each expert's fraction of the routes, before
        drops), dropped (the fraction of routes dropped) and, for router "topk", router_aux (the Switch
        load-balancing loss E·Σ_e load_e·mean probability_e, 1 when balanced)."""
        cfg = self.cfg
        rows, seq_len, d = x_BxLxD.shape
        l = expert_group_len(cfg, seq_len)
        b = rows * seq_len // l
        x_BxLxD, tokens_BxL = x_BxLxD.reshape(b, l, d), tokens_BxL.reshape(b, l)
        e, r, c = cfg.n_experts, cfg.experts_per_token, expert_capacity(cfg, l)
        expert_axis = EXPERT if cfg.expert_parallel else "expert_whole"
        if cfg.router == "hash":
            expert_BxLxR = (token_hash(tokens_BxL) % e).astype(jnp.int32)[..., None]
            gate_BxLxR = jnp.ones((b, l, 1), jnp.float32)
        else:
            router_DxE = self.param("router", declare(UNIT_NORMAL, Role.ROUTER, ("embed", expert_axis)), (d, e))
            probs_BxLxE = jax.nn.softmax(jnp.dot(x_BxLxD.astype(jnp.float32), router_DxE), axis=-1)
            gate_BxLxR, expert_BxLxR = jax.lax.top_k(probs_BxLxE, r)
            if cfg.normalize_gates:
                gate_BxLxR = gate_BxLxR / jnp.sum(gate_BxLxR, axis=-1, keepdims=True)
        routes_BxLRxE = jax.nn.one_hot(expert_BxLxR.reshape(b, l * r), e, dtype=jnp.int32)
        slot_BxLRxE = jnp.cumsum(routes_BxLRxE, axis=1) - 1  # each route's place in its expert's buffer
        # one_hot gives zeros for a slot past the capacity: the route is dropped
        dispatch_BxLxRxExC = (jax.nn.one_hot(slot_BxLRxE, c) * routes_BxLRxE[..., None]).reshape(b, l, r, e, c)
        dispatch_BxLxExC = jnp.sum(dispatch_BxLxRxExC, axis=2)
        combine_BxLxExC = jnp.einsum("blrec,blr->blec", dispatch_BxLxRxExC, gate_BxLxR)

        experts = nn.vmap(self.expert, variable_axes={"params": 0}, split_rngs={"params": True},
                          metadata_params={nn.PARTITION_NAME: expert_axis})(cfg, name="experts")
        # Dispatched where their tokens are, run where their experts are: with expert parallelism the partitioner
        # moves them between the two layouts with an all-to-all over fsdp, each way.
        at_tokens = (None, "batch", None, "activation_embed")
        at_experts = (expert_axis, "batch", None, "activation_embed")
        in_ExBxCxD = jnp.einsum("blec,bld->ebcd", dispatch_BxLxExC.astype(cfg.dtype), x_BxLxD)
        in_ExBxCxD = sharding.constrain(sharding.constrain(in_ExBxCxD, at_tokens), at_experts)
        out_ExBxCxD = sharding.constrain(sharding.constrain(experts(in_ExBxCxD), at_experts), at_tokens)
        out_BxLxD = jnp.einsum("blec,ebcd->bld", combine_BxLxExC.astype(cfg.dtype), out_ExBxCxD)

        load_E = jnp.mean(routes_BxLRxE, axis=(0, 1), dtype=jnp.float32)
        stats = {"expert_load": load_E, "dropped": 1.0 - jnp.sum(dispatch_BxLxExC) / (b * l * r)}
        if cfg.router == "topk":
            stats["router_aux"] = e * jnp.sum(load_E * jnp.mean(probs_BxLxE, axis=(0, 1)))
        return out_BxLxD.reshape(rows, seq_len, d), stats
