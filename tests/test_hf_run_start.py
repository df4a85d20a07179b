"""An imported model as the start of a run: its configs (the gin given, or the defaults within the model's context,
with the model and tokenizer bound over them), refused with a tokenizer the model cannot read."""

import dataclasses
import os

import pytest

from celerity_jax import recipe
from celerity_jax.errors import ConfigError
from celerity_jax.hf import run_start
from celerity_jax.model import presets

CFG = presets.preset("tiny-d32")


def test_without_gin_the_defaults_run_within_the_models_context(tiny_gin):
    assert CFG.max_seq_len < recipe.RecipeConfig().seq_len
    model_bindings = run_start.bindings(CFG, "tokenizer.json", "<|endoftext|>")
    configs = run_start.run_configs(CFG, model_bindings)
    assert configs.recipe.seq_len == CFG.max_seq_len
    assert configs.model == CFG and (configs.data.tokenizer, configs.data.separator_token) == (
        "tokenizer.json", "<|endoftext|>")
    given = run_start.run_configs(CFG, model_bindings, tiny_gin[:1])
    assert given.recipe.seq_len != CFG.max_seq_len and given.model == CFG


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_before_anything_is_written(tmp_path):
    small = dataclasses.replace(CFG, vocab_size=200)
    with pytest.raises(ConfigError, match="tokenizer has 257 token ids but the model's vocabulary holds 200"):
        run_start.write(str(tmp_path), small, {}, tokenizer="byte", separator_token="", tokenizer_now="byte")
    assert os.listdir(tmp_path) == []
