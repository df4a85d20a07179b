import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.model.params import count_params
from celerity_jax.model.presets import PRESETS, preset

CELERITY_N = {"celerity-300m": 2.71e8, "celerity-500m": 5.03e8, "celerity-900m": 9.06e8,
              "celerity-1.8b": 1.81e9, "celerity-3.9b": 3.88e9}
SECTION3_N = {"s3-111m": 111e6, "s3-266m": 266e6, "s3-610m": 610e6, "s3-1.7b": 1.7e9, "s3-3.3b": 3.3e9}


@pytest.mark.parametrize("name, n", CELERITY_N.items())
def test_celerity_presets_match_the_paper_within_half_a_percent(name, n):
    assert count_params(preset(name)) == pytest.approx(n, rel=5e-3)


@pytest.mark.parametrize("name, n", SECTION3_N.items())
def test_section3_presets_are_near_their_names(name, n):
    cfg = preset(name)
    assert (cfg.vocab_size, cfg.max_seq_len, cfg.positions, cfg.mlp, cfg.head_dim) == (
        50257, 2048, "alibi", "swiglu", 64)
    assert count_params(cfg) == pytest.approx(n, rel=1.5e-2)


def test_celerity_shapes_follow_the_table():
    shapes = [(c.d_model, c.n_heads, c.head_dim, c.n_layers) for n, c in PRESETS.items() if n in CELERITY_N]
    assert shapes == [(640, 10, 64, 13), (896, 14, 64, 17), (1152, 9, 128, 23), (1536, 12, 128, 30),
                      (2048, 16, 128, 40)]


def test_tiny_ladder_grows():
    tiny = [count_params(c) for n, c in PRESETS.items() if n.startswith("tiny-")]
    assert len(tiny) >= 4 and tiny == sorted(tiny) and tiny[-1] < 2e6


def test_preset_overrides_and_errors():
    assert preset("tiny-d64", scan_layers=True).scan_layers
    with pytest.raises(ConfigError, match="celerity-300m"):
        preset("celerity-7b")
    with pytest.raises(ConfigError, match="d_modle"):
        preset("tiny-d64", d_modle=3)
    with pytest.raises(ConfigError, match="head_dim"):
        preset("tiny-d64", d_model=96)
