import os

import pytest

from celerity_jax import gin_config
from celerity_jax.errors import ConfigError
from celerity_jax.model import presets
from celerity_jax.model.config import ModelConfig
from celerity_jax.recipe import RecipeConfig


def test_files_then_bindings_with_includes_beside_the_file(tmp_path, monkeypatch):
    (tmp_path / "base.gin").write_text("ModelConfig.d_model = 896\nModelConfig.n_heads = 14\n")
    (tmp_path / "run.gin").write_text("include 'base.gin'\nRecipeConfig.tpp = 80\n")
    monkeypatch.chdir(tmp_path.parent)
    configs = gin_config.parse_gin([str(tmp_path / "run.gin")], ["RecipeConfig.tau = 0.1"])
    assert configs["model"] == ModelConfig(d_model=896, n_heads=14)
    assert configs["recipe"] == RecipeConfig(tpp=80, tau=0.1)
    assert "ModelConfig.d_model = 896" in gin_config.operative_config_str()


def test_base_config_keeps_unbound_fields():
    base = {"model": presets.preset("tiny-d48")}
    configs = gin_config.parse_gin([], ["ModelConfig.n_layers = 3"], base=base)
    assert configs["model"] == presets.preset("tiny-d48", n_layers=3)
    assert configs["recipe"] == RecipeConfig()


@pytest.mark.parametrize("binding, names", [
    ("ModelConfig.d_modle = 640", ["d_modle", "d_model, n_heads"]),
    ("ModelConf.d_model = 640", ["ModelConf", "ModelConfig, RecipeConfig"]),
    ("RecipeConfig.tpp = = 3", ["--gin_param, line 1", "RecipeConfig.tpp = = 3", "Class.field = value"]),
    ("RecipeConfig.tpp = -3", ["RecipeConfig.tpp = -3 must be > 0"]),
])
def test_bad_bindings_raise_config_error_with_fix(binding, names):
    with pytest.raises(ConfigError) as e:
        gin_config.parse_gin([], [binding])
    for name in names:
        assert name in str(e.value)


def test_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        gin_config.parse_gin([str(tmp_path / "nope.gin")])
    (tmp_path / "run.gin").write_text("include 'missing.gin'\n")
    with pytest.raises(ConfigError, match="missing.gin.*\n.*beside the including gin file"):
        gin_config.parse_gin([str(tmp_path / "run.gin")])


def test_train_from_gin_trains_and_saves_the_operative_config(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [os.path.join(root, "experiments/tiny/d48.gin"), os.path.join(root, "tests/configs/smoke.gin")]
    workdir = tmp_path / "run"
    summary = gin_config.train_from_gin(files, ["TrainConfig.stop_at_step = 5"], str(workdir), log=lambda _: None)
    assert summary["final_step"] == 5 and summary["stopped"] == "stop_at_step"
    operative = (workdir / "config.gin").read_text()
    assert "TrainConfig.stop_at_step = 5" in operative and "ModelConfig.d_model = 48" in operative
