import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax import recipe
from celerity_jax.errors import ConfigError
from celerity_jax.model import completep, moe, transformer
from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.params import count_active_params, count_params, flops_per_token
from celerity_jax.model.sharding import make_mesh
from celerity_jax.train import step as step_lib

TINY = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, vocab_size=64, max_seq_len=8,
                   d_base=16, n_layers_base=1)


def _cfg(**overrides) -> ModelConfig:
    return dataclasses.replace(TINY, **overrides)


def _tokens(cfg, batch=2, seed=1):
    return jax.random.randint(jax.random.key(seed), (batch, cfg.max_seq_len), 0, cfg.vocab_size)


def _numbered_experts(cfg: ModelConfig, router_DxE=None) -> dict:
    """MixtureOfExperts params whose expert e outputs e + 1 in every dim (zero kernels, down bias e + 1)."""
    shapes = jax.eval_shape(lambda: moe.MixtureOfExperts(cfg, transformer.Mlp).init(
        jax.random.key(0), jnp.zeros((1, cfg.max_seq_len, cfg.d_model)), jnp.zeros((1, cfg.max_seq_len), jnp.int32)))
    params = jax.tree.map(lambda x: jnp.zeros(x.shape), shapes["params"])
    params["experts"]["down"]["bias"] = jnp.broadcast_to(
        jnp.arange(1.0, cfg.n_experts + 1)[:, None], (cfg.n_experts, cfg.d_model))
    if router_DxE is not None:
        params["router"] = jnp.asarray(router_DxE, jnp.float32)
    return params


def _moe(cfg, params, x_BxLxD, tokens_BxL):
    return moe.MixtureOfExperts(cfg, transformer.Mlp).apply({"params": params}, x_BxLxD, tokens_BxL)


def test_one_expert_is_the_dense_model_whatever_the_router_fields():
    dense = _cfg(mlp="swiglu")
    one = dataclasses.replace(dense, router="hash", capacity_factor=0.1, router_aux_coef=1.0)
    params = transformer.init_params(dense, jax.random.key(0))
    one_params = transformer.init_params(one, jax.random.key(0))
    assert jax.tree.all(jax.tree.map(np.array_equal, params, one_params))
    tokens = _tokens(dense)
    np.testing.assert_array_equal(transformer.apply(one, params, tokens), transformer.apply(dense, params, tokens))
    loss, terms = transformer.next_token_loss(one, params, tokens, tokens)
    assert loss == transformer.next_token_loss(dense, params, tokens, tokens)[0]
    assert set(terms) == {"cross_entropy", "z_loss"}


def test_hash_routing_sends_each_token_to_expert_hash_of_its_id_mod_e():
    cfg = _cfg(n_experts=4, router="hash", use_bias=True, capacity_factor=4.0)  # capacity: every token
    tokens = jnp.arange(16).reshape(2, 8) * 4
    out, stats = _moe(cfg, _numbered_experts(cfg), jnp.ones((2, 8, cfg.d_model)), tokens)
    expected = [((t * 2654435761) % 2**32 >> 16) % 4 + 1 for t in np.asarray(tokens).ravel().tolist()]
    np.testing.assert_array_equal(out[..., 0].ravel(), expected)
    assert np.all(out == out[..., :1])
    np.testing.assert_allclose(stats["expert_load"], np.bincount(np.array(expected) - 1, minlength=4) / 16)
    assert stats["dropped"] == 0 and "router_aux" not in stats


def test_topk_drops_the_routes_past_an_experts_capacity_in_order_of_position():
    cfg = _cfg(n_experts=2, use_bias=True, capacity_factor=0.5)  # C = ceil(0.5 · 8 / 2) = 2 per sequence
    assert moe.expert_capacity(cfg, 8) == 2
    router_DxE = np.zeros((cfg.d_model, 2))
    router_DxE[0, 0] = math.log(3.0)  # every token of x prefers expert 0 with probability 3/4
    x = jnp.zeros((2, 8, cfg.d_model)).at[..., 0].set(1.0)
    out, stats = _moe(cfg, _numbered_experts(cfg, router_DxE), x, jnp.zeros((2, 8), jnp.int32))
    np.testing.assert_allclose(out[:, :2], 0.75)  # expert 0 (output 1) × its gate, for its two slots
    np.testing.assert_array_equal(out[:, 2:], 0.0)  # the rest dropped: the residual stream carries them
    assert stats["dropped"] == pytest.approx(0.75)
    np.testing.assert_allclose(stats["expert_load"], [1.0, 0.0])


def test_top_two_routing_sums_the_gated_outputs_of_the_two_most_probable_experts():
    cfg = _cfg(n_experts=4, experts_per_token=2, use_bias=True, capacity_factor=2.0)  # C = L: nothing dropped
    router_DxE = jax.random.normal(jax.random.key(0), (cfg.d_model, 4))
    x = jax.random.normal(jax.random.key(1), (2, 8, cfg.d_model))
    out, stats = _moe(cfg, _numbered_experts(cfg, router_DxE), x, jnp.zeros((2, 8), jnp.int32))
    gate_BxLx2, expert_BxLx2 = jax.lax.top_k(jax.nn.softmax(x @ router_DxE), 2)
    np.testing.assert_allclose(out[..., 0], jnp.sum(gate_BxLx2 * (expert_BxLx2 + 1), axis=-1), rtol=1e-5)
    assert stats["dropped"] == 0


def test_normalized_gates_sum_to_one_over_a_tokens_experts():
    cfg = _cfg(n_experts=4, experts_per_token=2, use_bias=True, capacity_factor=None, normalize_gates=True)
    router_DxE = jax.random.normal(jax.random.key(0), (cfg.d_model, 4))
    x = jax.random.normal(jax.random.key(1), (2, 8, cfg.d_model))
    out, _ = _moe(cfg, _numbered_experts(cfg, router_DxE), x, jnp.zeros((2, 8), jnp.int32))
    gate_BxLx2, expert_BxLx2 = jax.lax.top_k(jax.nn.softmax(x @ router_DxE), 2)
    gate_BxLx2 = gate_BxLx2 / jnp.sum(gate_BxLx2, axis=-1, keepdims=True)
    np.testing.assert_allclose(out[..., 0], jnp.sum(gate_BxLx2 * (expert_BxLx2 + 1), axis=-1), rtol=1e-5)


def test_capacity_none_drops_nothing_even_when_every_token_takes_one_expert():
    cfg = _cfg(n_experts=8, router="hash", use_bias=True, capacity_factor=None)
    assert moe.expert_capacity(cfg, 8) == 8
    tokens = jnp.full((2, 8), 5)
    out, stats = _moe(cfg, _numbered_experts(cfg), jnp.ones((2, 8, cfg.d_model)), tokens)
    assert stats["dropped"] == 0
    np.testing.assert_array_equal(out[..., 0], ((5 * 2654435761) % 2**32 >> 16) % 8 + 1)


def test_the_load_balancing_loss_is_e_times_load_dot_mean_probability():
    cfg = _cfg(n_experts=2, capacity_factor=2.0)
    router_DxE = np.zeros((cfg.d_model, 2))
    router_DxE[0, 0] = router_DxE[1, 1] = math.log(3.0)
    # tokens A, A, B: A prefers expert 0 with probability 3/4, B expert 1; load (2/3, 1/3), mean probability
    # (7/12, 5/12), so the loss is 2 · (2/3 · 7/12 + 1/3 · 5/12) = 19/18
    x = jnp.zeros((1, 3, cfg.d_model)).at[0, :2, 0].set(1.0).at[0, 2, 1].set(1.0)
    _, stats = _moe(cfg, _numbered_experts(cfg, router_DxE), x, jnp.zeros((1, 3), jnp.int32))
    assert stats["router_aux"] == pytest.approx(19 / 18)
    np.testing.assert_allclose(stats["expert_load"], [2 / 3, 1 / 3])


def test_the_loss_adds_the_mean_load_balancing_loss_times_its_coefficient():
    cfg = _cfg(n_experts=4, experts_per_token=2)
    params = transformer.init_params(cfg, jax.random.key(0))
    tokens = _tokens(cfg)
    _, stats = transformer.apply(cfg, params, tokens, return_stats=True)
    assert stats["router_aux"].shape == (2,) and stats["expert_load"].shape == (2, 4)
    free, terms = transformer.next_token_loss(dataclasses.replace(cfg, router_aux_coef=0.0), params, tokens, tokens)
    total, _ = transformer.next_token_loss(cfg, params, tokens, tokens)
    assert terms["router_aux"] == pytest.approx(float(jnp.mean(stats["router_aux"])))
    assert float(total) == pytest.approx(float(free + 0.01 * terms["router_aux"]), rel=1e-6)
    assert terms["dropped"] == pytest.approx(float(jnp.mean(stats["dropped"])))


def test_a_dropped_route_depends_on_earlier_tokens_only():
    cfg = _cfg(n_experts=4, experts_per_token=2, capacity_factor=0.5)
    params = transformer.init_params(cfg, jax.random.key(0))
    tokens = _tokens(cfg)
    _, stats = transformer.apply(cfg, params, tokens, return_stats=True)
    assert jnp.all(stats["dropped"] > 0)
    changed = tokens.at[:, 5:].set((tokens[:, 5:] + 1) % cfg.vocab_size)
    np.testing.assert_array_equal(transformer.apply(cfg, params, changed)[:, :5],
                                  transformer.apply(cfg, params, tokens)[:, :5])


def test_experts_take_the_hidden_role_and_the_router_a_readout_init_with_the_hidden_lr():
    cfg = _cfg(n_experts=4)  # m_d = 2
    roles = completep.multipliers(cfg, transformer.declarations(cfg)).role["block_0"]["mlp"]
    assert roles["router"] is Role.ROUTER
    assert set(jax.tree.leaves(roles["experts"])) == {Role.HIDDEN}
    rules = completep.role_rules(cfg)
    assert rules[Role.ROUTER][:3] == pytest.approx((cfg.sigma_base / 2, *rules[Role.HIDDEN][1:3])) and rules[Role.ROUTER][3]
    assert completep.weight_decay_multipliers(cfg, "width_scaled")[Role.ROUTER] == 2.0
    # a model without a router keeps its plan's roles
    assert Role.ROUTER not in completep.role_rules(TINY)
    assert Role.ROUTER not in completep.role_rules(_cfg(n_experts=4, router="hash"))


@pytest.mark.parametrize("router, mlp, scan", [("topk", "swiglu", True), ("hash", "gelu", False)])
def test_n_counts_every_expert_and_flops_count_the_active_ones(router, mlp, scan):
    k = 2 if router == "topk" else 1
    cfg = _cfg(n_experts=4, router=router, experts_per_token=k, mlp=mlp, use_bias=True, scan_layers=scan)
    shapes = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    assert count_params(cfg) == sum(x.size for x in jax.tree.leaves(shapes))
    experts = sum(x.size for path, x in jax.tree_util.tree_leaves_with_path(shapes)
                  if "experts" in jax.tree_util.keystr(path))
    assert count_params(cfg) - count_active_params(cfg) == experts // 4 * (4 - k)
    assert flops_per_token(cfg, 8) == 6 * count_active_params(cfg) + 12 * 2 * 2 * 16 * 8


@pytest.mark.parametrize("overrides, field", [
    ({"n_experts": 0}, "n_experts"), ({"n_experts": 4, "experts_per_token": 5}, "experts_per_token"),
    ({"experts_per_token": 2}, "experts_per_token"), ({"n_experts": 4, "router": "hash", "experts_per_token": 2},
                                                      "experts_per_token"),
    ({"router": "random"}, "router"), ({"capacity_factor": 0.0}, "capacity_factor"),
    ({"capacity_factor": -1.0}, "capacity_factor"), ({"expert_group_len": 0}, "expert_group_len"),
    ({"router_aux_coef": -0.1}, "router_aux_coef")])
def test_bad_mixture_settings_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=f"ModelConfig.{field}="):
        _cfg(**overrides)


def test_a_tiny_mixture_trains_through_the_train_step(tiny_configs):
    configs = tiny_configs("ModelConfig.n_experts = 4", "ModelConfig.experts_per_token = 2",
                           "RecipeConfig.seq_len = 16", "RecipeConfig.warmup_frac = 0.0")
    plan = recipe.make_plan(configs.model, configs.recipe)
    build = step_lib.build_step(configs.model, plan, configs.monitor, make_mesh((1, 1, 1), jax.devices()[:1]),
                                microbatches=1, z_loss=0.0, seed=0)
    tokens = jax.random.randint(jax.random.key(0), (plan.batch_seqs, 17), 0, 257)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    state, losses = build.init(), []
    for _ in range(6):
        state, metrics = build.train_step(state, batch)
        losses.append(float(metrics["train/loss"]))
    assert losses[-1] < losses[0] - 0.1, losses


def test_groups_of_positions_are_dispatched_each_with_its_own_capacity():
    cfg = _cfg(n_experts=2, use_bias=True, capacity_factor=0.5, expert_group_len=4)  # C = 1 per group of 4
    assert moe.expert_group_len(cfg, 8) == 4 and moe.expert_capacity(cfg, 4) == 1
    router_DxE = np.zeros((cfg.d_model, 2))
    router_DxE[0, 0] = math.log(3.0)  # every token prefers expert 0
    x = jnp.zeros((2, 8, cfg.d_model)).at[..., 0].set(1.0)
    out, stats = _moe(cfg, _numbered_experts(cfg, router_DxE), x, jnp.zeros((2, 8), jnp.int32))
    kept = np.zeros(8)
    kept[[0, 4]] = 0.75  # the first position of each group
    np.testing.assert_allclose(out[..., 0], np.broadcast_to(kept, (2, 8)))
    assert stats["dropped"] == pytest.approx(0.75)
    whole = dataclasses.replace(cfg, expert_group_len=3)  # 3 does not divide 8: the whole sequence, C = 2
    assert moe.expert_group_len(whole, 8) == 8
    np.testing.assert_allclose(_moe(whole, _numbered_experts(cfg, router_DxE), x, jnp.zeros((2, 8), jnp.int32))[0]
                               [..., 0], np.broadcast_to([0.75, 0.75, 0, 0, 0, 0, 0, 0], (2, 8)))


def test_a_training_sequence_must_be_a_whole_number_of_groups(tiny_configs):
    configs = tiny_configs("ModelConfig.n_experts = 4", "ModelConfig.expert_group_len = 6", "RecipeConfig.seq_len = 16")
    with pytest.raises(ConfigError, match="RecipeConfig.seq_len = 16 is not a multiple of ModelConfig.expert_group_len"):
        recipe.make_plan(configs.model, configs.recipe)
