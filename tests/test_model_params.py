import dataclasses
import itertools

import jax
import pytest

from celerity_jax.model import sharding, transformer
from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.params import EXPERT, FOLDS, LAYERS, Declaration, count_params, declare, flops_per_token
from celerity_jax.model.presets import PRESETS


def _real_count(cfg: ModelConfig) -> int:
    shapes = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))  # allocates nothing
    return sum(x.size for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("norm, mlp, positions, tie, bias", list(itertools.product(
    ("layernorm", "rmsnorm"), ("squared_relu", "swiglu", "gelu"), ("alibi", "learned"), (False, True),
    (False, True)))[::3])
def test_count_equals_the_real_count_on_small_configs(norm, mlp, positions, tie, bias):
    cfg = ModelConfig(n_layers=3, d_model=48, n_heads=3, head_dim=16, vocab_size=97, max_seq_len=24, norm=norm,
                      mlp=mlp, mlp_ratio=8 / 3 if mlp == "swiglu" else 4.0, positions=positions,
                      tie_embeddings=tie, use_bias=bias, scan_layers=bias)
    assert count_params(cfg) == _real_count(cfg)


@pytest.mark.parametrize("name", ["celerity-300m", "celerity-3.9b", "s3-266m"])
def test_count_equals_the_real_count_on_presets(name):
    cfg = ModelConfig(**{**PRESETS[name].__dict__, "scan_layers": True})
    assert count_params(cfg) == _real_count(cfg)


def test_flops_per_token_is_6n_plus_attention():
    cfg = PRESETS["celerity-300m"]
    n = count_params(cfg)
    assert n == 20 * 640**2 * 13 + 2 * 128256 * 640 + (2 * 13 + 1) * 640  # 20·d²·L + 2·V·d + norm gains
    assert flops_per_token(cfg, 8192) == 6 * n + 12 * 13 * 10 * 64 * 8192
    assert flops_per_token(cfg, 1024) < flops_per_token(cfg, 8192)


@pytest.mark.parametrize("name, variant", [(name, {"scan_layers": True}) for name in sorted(PRESETS)] + [("tiny-d32", {}),
    ("tiny-d32", {"scan_layers": True, "use_bias": True, "positions": "learned"}),
    ("tiny-d32", {"tie_embeddings": True, "mlp": "swiglu", "n_kv_heads": 1}),
    ("tiny-d32", {"n_experts": 4, "experts_per_token": 2, "mlp": "swiglu", "use_bias": True, "scan_layers": True}),
    ("tiny-d32", {"n_experts": 4, "router": "hash"})])
def test_every_parameter_of_every_preset_declares_a_role_and_an_axis_per_dim(name, variant):
    cfg = dataclasses.replace(PRESETS[name], **variant)
    shapes = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    declared = transformer.declarations(cfg)
    assert jax.tree.structure(declared) == jax.tree.structure(shapes)
    for d, x in zip(jax.tree.leaves(declared), jax.tree.leaves(shapes)):
        assert isinstance(d, Declaration) and isinstance(d.role, Role)
        assert len(d.axes) == x.ndim and all(axis in sharding.LOGICAL_RULES for axis in d.axes)
        assert d.fold in FOLDS + (None,)
        assert (d.axes[0] == LAYERS) == (cfg.scan_layers and d.role in (Role.HIDDEN, Role.BLOCK_VECTOR, Role.ROUTER))
    for path, d in jax.tree_util.tree_leaves_with_path(declared):  # a mixture's experts and router, nothing else
        assert (EXPERT in d.axes) == (cfg.n_experts > 1 and "['mlp']" in jax.tree_util.keystr(path))


def test_a_fold_that_is_no_forward_multiplier_is_refused():
    with pytest.raises(ValueError, match="fold 'logits' is none of"):
        declare(lambda key, shape: None, Role.HIDDEN, ("embed", "mlp"), "logits")


def test_grouped_key_value_heads_shrink_k_and_v_only():
    mha = dataclasses.replace(PRESETS["celerity-300m"], positions="rope")
    gqa = dataclasses.replace(mha, n_kv_heads=2)
    kv_saved = 2 * mha.d_model * (mha.n_heads - 2) * mha.head_dim * mha.n_layers
    assert count_params(mha) - count_params(gqa) == kv_saved
    assert count_params(gqa) == _real_count(gqa)
    assert flops_per_token(mha, 1024) - flops_per_token(gqa, 1024) == 6 * kv_saved
    k = transformer.declarations(gqa)["block_0"]["attn"]["k"]["kernel"]
    assert k == Declaration(Role.HIDDEN, ("embed", "kv_heads"))
