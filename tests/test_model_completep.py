import functools
import math

import jax
import pytest

from celerity_jax.model import completep, transformer
from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig

# m_d = 128/32 = 4, m_L = 4/1 = 4.
CFG = ModelConfig(n_layers=4, d_model=128, n_heads=8, head_dim=16, vocab_size=64, max_seq_len=32,
                  d_base=32, n_layers_base=1, sigma_base=0.1, alpha_input=2.0, alpha_output=3.0)


@functools.cache
def _shapes(cfg):
    return jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))


def _roles(cfg) -> list[Role]:
    return [d.role for d in jax.tree.leaves(transformer.declarations(cfg))]


def _by_role(cfg, tree):
    """{role name: value} over the leaves of `tree` (a multipliers field); one value per role."""
    out = {}
    for role, value in zip(_roles(cfg), jax.tree.leaves(tree)):
        out.setdefault(role.value, set()).add(value)
    assert all(len(values) == 1 for values in out.values())
    return {role: values.pop() for role, values in out.items()}


@pytest.mark.parametrize("overrides", [
    {}, {"scan_layers": True}, {"tie_embeddings": True, "positions": "learned"},
    {"use_bias": True, "mlp": "swiglu", "scan_layers": True}, {"norm": "rmsnorm", "use_bias": True, "mlp": "gelu"},
])
def test_every_leaf_gets_exactly_the_expected_role(overrides):
    cfg = ModelConfig(**{**CFG.__dict__, **overrides})
    shapes = _shapes(cfg)
    assert jax.tree.structure(transformer.declarations(cfg)) == jax.tree.structure(shapes)
    roles = _roles(cfg)
    counts = {r: roles.count(r) for r in Role}
    n_mats = 4 + (3 if cfg.mlp == "swiglu" else 2)
    n_blocks = 1 if cfg.scan_layers else cfg.n_layers
    assert counts[Role.HIDDEN] == n_blocks * n_mats
    norm_leaves = 2 if cfg.norm == "layernorm" and cfg.use_bias else 1  # scale (and bias)
    assert counts[Role.BLOCK_VECTOR] == n_blocks * (2 * norm_leaves + (n_mats if cfg.use_bias else 0))
    assert counts[Role.EMBEDDING] == 1 + (cfg.positions == "learned")
    assert counts[Role.UNEMBEDDING] == (0 if cfg.tie_embeddings else 1)
    assert counts[Role.FINAL_NORM] == norm_leaves


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_multipliers_equal_the_science_table(alpha):
    cfg = ModelConfig(**{**CFG.__dict__, "depth_alpha": alpha})
    m_d, m_l, s = 4.0, 4.0, 0.1
    mult = completep.multipliers(cfg, transformer.declarations(cfg))
    depth_lr = m_l ** (alpha - 1)
    assert _by_role(cfg, mult.init_std) == pytest.approx({
        "embedding": s, "hidden": s / math.sqrt(m_d), "block_vector": 0.0, "final_norm": 0.0, "unembedding": s})
    assert _by_role(cfg, mult.lr) == pytest.approx({
        "embedding": 1.0, "hidden": depth_lr / m_d, "block_vector": depth_lr, "final_norm": 1.0,
        "unembedding": 1.0})
    in_block = 1 / (m_d * m_l**alpha)
    assert _by_role(cfg, mult.eps) == pytest.approx({
        "embedding": 1 / m_d, "hidden": in_block, "block_vector": in_block, "final_norm": 1 / m_d,
        "unembedding": 1 / m_d})
    assert _by_role(cfg, mult.decay) == {
        "embedding": True, "hidden": True, "block_vector": False, "final_norm": False, "unembedding": True}
    fwd = completep.forward_multipliers(cfg)
    assert fwd == pytest.approx({"input": 2.0, "residual": m_l**-alpha, "output": 3.0 / m_d, "attention": 1 / 16})


def test_alpha_one_has_no_depth_lr_factor():
    rules = completep.role_rules(CFG)
    assert rules[Role.HIDDEN][1] == pytest.approx(1 / 4) and rules[Role.BLOCK_VECTOR][1] == 1.0


def test_mup_ignores_depth_and_standard_ignores_both():
    mup = ModelConfig(**{**CFG.__dict__, "parametrization": "mup"})
    assert completep.width_depth_mult(mup) == (4.0, 1.0)
    assert completep.forward_multipliers(mup)["residual"] == 1.0
    assert completep.role_rules(mup)[Role.HIDDEN] == pytest.approx((0.1 / 2, 1 / 4, 1 / 4, True))
    sp = ModelConfig(**{**CFG.__dict__, "parametrization": "standard"})
    assert completep.forward_multipliers(sp) == pytest.approx(
        {"input": 2.0, "residual": 1.0, "output": 3.0, "attention": 1 / 4})
    assert {rule[:3] for role, rule in completep.role_rules(sp).items() if role is not Role.BLOCK_VECTOR
            and role is not Role.FINAL_NORM} == {(0.1, 1.0, 1.0)}


def test_weight_decay_multipliers_per_convention():
    no_decay = {Role.BLOCK_VECTOR: 0.0, Role.FINAL_NORM: 0.0}
    assert completep.weight_decay_multipliers(CFG, "per_lr") == {
        Role.EMBEDDING: 1.0, Role.HIDDEN: 1.0, Role.UNEMBEDDING: 1.0, **no_decay}
    assert completep.weight_decay_multipliers(CFG, "width_scaled") == {
        Role.EMBEDDING: 1.0, Role.HIDDEN: 4.0, Role.UNEMBEDDING: 1.0, **no_decay}  # m_d = 4
    sp = ModelConfig(**{**CFG.__dict__, "parametrization": "standard"})
    assert completep.weight_decay_multipliers(sp, "width_scaled") == completep.weight_decay_multipliers(sp, "per_lr")
