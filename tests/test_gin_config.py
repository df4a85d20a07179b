import subprocess
import sys

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
    assert configs.model == ModelConfig(d_model=896, n_heads=14)
    assert configs.recipe == RecipeConfig(tpp=80, tau=0.1)
    assert "ModelConfig.d_model = 896" in gin_config.operative_config_str()


def test_base_config_keeps_unbound_fields():
    base = {"model": presets.preset("tiny-d48")}
    configs = gin_config.parse_gin([], ["ModelConfig.n_layers = 3"], base=base)
    assert configs.model == presets.preset("tiny-d48", n_layers=3)
    assert configs.recipe == RecipeConfig()


@pytest.mark.parametrize("binding, problem, fix", [
    ("ModelConfig.d_modle = 640", "doesn't have a parameter named 'd_modle'", "d_model, n_heads"),
    ("ModelConf.d_model = 640", "No configurable matching 'ModelConf'", "ModelConfig, RecipeConfig"),
    ("RecipeConfig.tpp = = 3", "Unable to parse value", "Class.field = value"),
    ("RecipeConfig.tpp = (", "a bracket or a string quote is never closed", "close every ("),
    ("RecipeConfig.bands = [20, 80", "a bracket or a string quote is never closed", "close every ("),
    ("RecipeConfig.tau = abc", "abc is not a Python literal", "put strings in quotes"),
    ("import no_such_module", "No module named 'no_such_module'", "Class.field = value"),
    ("include 'missing.gin'", "Unable to open file: missing.gin", "beside the including gin file"),
])
def test_a_bad_binding_is_named_in_one_line_with_the_fix(binding, problem, fix):
    with pytest.raises(ConfigError) as e:
        gin_config.parse_gin([], ["RecipeConfig.tpp = 80", binding])
    assert "\n" not in str(e.value)
    first, fix_part = str(e.value).rsplit("; fix: ", 1)
    assert first.startswith(f"gin: --gin-param {binding!r}: ") and problem in first and fix in fix_part


def test_an_error_in_a_file_names_the_file_and_line(tmp_path):
    (tmp_path / "base.gin").write_text("# the base\nRecipeConfig.tpp = 80\nRecipeConfig.tau = abc\n")
    (tmp_path / "run.gin").write_text("include 'base.gin'\n")
    with pytest.raises(ConfigError) as e:
        gin_config.parse_gin([str(tmp_path / "run.gin")])
    assert str(e.value).split("; fix: ")[0] == (f"gin: {tmp_path / 'base.gin'}, line 3: 'RecipeConfig.tau = abc': "
                                                "abc is not a Python literal")


@pytest.mark.parametrize("binding, message", [
    ("RecipeConfig.tpp = -3", "RecipeConfig.tpp = -3 must be > 0 (e.g. 20, 80 or 234)"),
    ("TrainConfig.seed = None", "TrainConfig.seed=None must be an int, e.g. 0"),
    ("TrainConfig.collapse_reference = 'ref.json'",
     "TrainConfig.collapse_reference='ref.json' must be a tuple of strings; give a tuple, e.g. ('ref.json',)"),
])
def test_a_bad_value_fails_with_the_configs_own_line(binding, message):
    with pytest.raises(ConfigError) as e:
        gin_config.parse_gin([], [binding])
    assert str(e.value) == message


def test_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        gin_config.parse_gin([str(tmp_path / "nope.gin")])
    (tmp_path / "run.gin").write_text("include 'missing.gin'\n")
    with pytest.raises(ConfigError, match="missing.gin.*; fix: .*beside the including gin file"):
        gin_config.parse_gin([str(tmp_path / "run.gin")])


def test_celerity_train_with_a_bad_value_exits_2_with_one_line(tmp_path, tiny_gin, repo_root):
    cmd = [sys.executable, "-m", "celerity_jax.cli", "train", "--workdir", str(tmp_path / "run"),
           "--gin-param", "TrainConfig.seed = None"]
    for path in tiny_gin:
        cmd += ["--gin-file", path]
    result = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr == "celerity train: error: TrainConfig.seed=None must be an int, e.g. 0\n"
    assert not (tmp_path / "run").exists()
