import itertools

import jax
import pytest

from celerity_jax.model import transformer
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.params import count_params, flops_per_token
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
