import dataclasses

import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig


def test_defaults_are_celerity_300m():
    cfg = ModelConfig()
    assert (cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.n_layers) == (640, 10, 64, 13)
    assert (cfg.vocab_size, cfg.max_seq_len, cfg.positions, cfg.norm, cfg.mlp) == (
        128256, 8192, "alibi", "layernorm", "squared_relu")
    assert cfg.d_ff == 8 * 640 and not cfg.tie_embeddings and not cfg.use_bias
    assert cfg.parametrization == "completep" and cfg.depth_alpha == 1.0


@pytest.mark.parametrize("fields, names", [
    (dict(d_model=650), ["d_model", "n_heads"]),  # not divisible by the 10 heads
    (dict(head_dim=32), ["head_dim", "64"]),
    (dict(norm="batchnorm"), ["norm", "layernorm"]),
    (dict(mlp="relu"), ["mlp", "swiglu"]),
    (dict(positions="sinusoidal"), ["positions", "rope"]),
    (dict(parametrization="ntk"), ["parametrization", "completep"]),
    (dict(remat="some"), ["remat", "dots"]),
    (dict(depth_alpha=0.4), ["depth_alpha", "[0.5, 1]"]),
    (dict(depth_alpha=1.1), ["depth_alpha", "[0.5, 1]"]),
    (dict(depth_alpha="1"), ["depth_alpha", "must be a number"]),
    (dict(mlp_ratio=1e-4), ["mlp_ratio", "MLP width of 0"]),
    (dict(n_layers=0), ["n_layers", "positive"]),
    (dict(sigma_base=-1.0), ["sigma_base", "positive"]),
    (dict(use_bias="yes"), ["use_bias", "True or False"]),
    (dict(positions="rope", d_model=630, n_heads=10, head_dim=63), ["head_dim", "even"]),
    (dict(attention_impl="cudnn", compute_dtype="float32"), ["attention_impl", "bfloat16"]),
    (dict(logits_chunk_len=-1), ["logits_chunk_len", "'auto', 0"]),
    (dict(logits_chunk_len="512"), ["logits_chunk_len", "'auto', 0"]),
    (dict(logits_chunk_len=True), ["logits_chunk_len", "an int or a string"]),
])
def test_bad_config_raises_config_error_naming_the_field(fields, names):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**fields)
    for name in names:
        assert name in str(err.value)


def test_replace_validates_again():
    with pytest.raises(ConfigError, match="n_heads"):
        dataclasses.replace(ModelConfig(), n_heads=7)


def test_config_is_hashable_for_jit_static_args():
    assert hash(ModelConfig()) == hash(ModelConfig())


def test_auto_compute_dtype_is_float32_on_cpu_and_explicit_values_stay():
    assert ModelConfig().compute_dtype == "auto"
    assert ModelConfig().dtype == "float32"  # the test machine is a CPU
    assert ModelConfig(compute_dtype="bfloat16").dtype == "bfloat16"


def test_auto_kernels_are_the_cpu_ones_on_cpu_and_explicit_values_stay():
    assert ModelConfig().attention_impl == "auto" and ModelConfig().dense_backward == "auto"
    assert ModelConfig().attention_kernel == "blocked"  # the test machine is a CPU
    assert ModelConfig().dense_backward_kernel == "transposed"
    assert ModelConfig(attention_impl="xla").attention_kernel == "xla"
    assert ModelConfig(dense_backward="plain").dense_backward_kernel == "plain"
    with pytest.raises(ConfigError, match="dense_backward"):
        ModelConfig(dense_backward="fast")
