import dataclasses

import pytest

from celerity_jax.collapse.config import MonitorConfig
from celerity_jax.config_types import check_field_types
from celerity_jax.configs import TrainConfig
from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig
from celerity_jax.recipe import RecipeConfig


@pytest.mark.parametrize("cls, fields, message", [
    # bool is exactly bool
    (DataConfig, dict(allow_repeat="no"), "DataConfig.allow_repeat='no' must be True or False"),
    (ModelConfig, dict(use_bias=1), "ModelConfig.use_bias=1 must be True or False"),
    # int is neither a float, a bool nor a string
    (TrainConfig, dict(checkpoint_every=2.5), "TrainConfig.checkpoint_every=2.5 must be an int, e.g. 500"),
    (TrainConfig, dict(log_every=True), "TrainConfig.log_every=True must be an int, e.g. 10"),
    (TrainConfig, dict(log_every="ten"), "TrainConfig.log_every='ten' must be an int, e.g. 10"),
    # float takes ints, not bools or strings
    (RecipeConfig, dict(tpp=True), "RecipeConfig.tpp=True must be a number, e.g. 20.0"),
    (RecipeConfig, dict(tpp="abc"), "RecipeConfig.tpp='abc' must be a number, e.g. 20.0"),
    # str
    (DataConfig, dict(tokenizer=5), "DataConfig.tokenizer=5 must be a string, e.g. 'byte'"),
    # None only where the field is optional
    (TrainConfig, dict(seed=None), "TrainConfig.seed=None must be an int, e.g. 0"),
    (RecipeConfig, dict(tau="0.1"), "RecipeConfig.tau='0.1' must be a number or None"),
    # tuples: a bare value is not one; elements and length are checked
    (TrainConfig, dict(collapse_reference="ref.json"),
     "TrainConfig.collapse_reference='ref.json' must be a tuple of strings; give a tuple, e.g. ('ref.json',)"),
    (DataConfig, dict(source="text", paths=("a.txt", 3)),
     "DataConfig.paths=('a.txt', 3) must be a tuple of strings"),
    (TrainConfig, dict(mesh_shape=8), "TrainConfig.mesh_shape=8 must be a tuple of 3 ints, e.g. (-1, 1, 1)"),
    (TrainConfig, dict(mesh_shape=(2, 1)), "TrainConfig.mesh_shape=(2, 1) must be a tuple of 3 ints, e.g. (-1, 1, 1)"),
    (MonitorConfig, dict(align_window=(0.2, "0.5")),
     "MonitorConfig.align_window=(0.2, '0.5') must be a tuple of 2 numbers, e.g. (0.25, 0.5)"),
    # a union
    (ModelConfig, dict(logits_chunk_len=2.5),
     "ModelConfig.logits_chunk_len=2.5 must be an int or a string, e.g. 'auto'"),
])
def test_a_wrong_type_fails_in_one_line_naming_the_field_and_the_fix(cls, fields, message):
    with pytest.raises(ConfigError) as e:
        cls(**fields)
    assert str(e.value) == message


@pytest.mark.parametrize("cls, fields, stored", [
    (RecipeConfig, dict(tpp=80, tau=None, batch_seqs=None), dict(tpp=80, tau=None, batch_seqs=None)),
    (ModelConfig, dict(logits_chunk_len=512), dict(logits_chunk_len=512)),
    (ModelConfig, dict(logits_chunk_len="auto"), dict(logits_chunk_len="auto")),
    # lists (from gin or JSON) are stored as tuples
    (TrainConfig, dict(mesh_shape=[2, 1, 1], collapse_reference=["ref.json"]),
     dict(mesh_shape=(2, 1, 1), collapse_reference=("ref.json",))),
    (RecipeConfig, dict(bands=[20, 80.0]), dict(bands=(20, 80.0))),
    (MonitorConfig, dict(align_window=[0.2, 0.5]), dict(align_window=(0.2, 0.5))),
])
def test_a_right_type_is_kept_and_a_list_becomes_a_tuple(cls, fields, stored):
    config = cls(**fields)
    for name, value in stored.items():
        assert getattr(config, name) == value and type(getattr(config, name)) is type(value)
    hash(config)


def test_an_annotation_without_a_rule_is_a_programming_error():
    @dataclasses.dataclass(frozen=True)
    class Config:
        weights: dict[str, float] = dataclasses.field(default_factory=dict)

    with pytest.raises(TypeError, match="no check for the annotation"):
        check_field_types(Config())
