"""Which transformers class holds a model, its config.json, and the names, shapes and layouts of its tensors."""

import dataclasses

import jax
import numpy as np
import pytest

from celerity_jax.hf import fold, layouts
from celerity_jax.model import transformer
from celerity_jax.model.config import ModelConfig

BASE = ModelConfig(n_layers=2, d_model=32, n_heads=4, head_dim=8, vocab_size=41, max_seq_len=16, d_base=16,
                   n_layers_base=2, mlp_ratio=2.0)
LLAMA = dict(positions="rope", norm="rmsnorm", mlp="swiglu")


@pytest.mark.parametrize("overrides, arch", [
    (LLAMA, "llama"), ({**LLAMA, "n_kv_heads": 2}, "llama"), (dict(positions="rope", mlp="gelu"), "gpt_neox"),
    (dict(positions="rope", mlp="gelu", n_kv_heads=2), "celerity"), ({}, "celerity"),
    ({**LLAMA, "positions": "alibi"}, "celerity")])
def test_each_model_goes_to_the_class_that_computes_it(overrides, arch):
    assert layouts.architecture(dataclasses.replace(BASE, **overrides)) == arch


def test_grouped_query_attention_is_num_key_value_heads():
    cfg = dataclasses.replace(BASE, **LLAMA, n_kv_heads=2)
    assert layouts.hf_config(cfg, "llama", dtype="float32", eos_id=40)["num_key_value_heads"] == 2
    assert layouts.hf_config(cfg, "celerity", dtype="float32", eos_id=40)["num_key_value_heads"] == 2
    shapes = layouts.expected_shapes(cfg, "llama")
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 8, 32)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (32, 32)
    assert shapes["lm_head.weight"] == (41, 32) and shapes["model.embed_tokens.weight"] == (41, 32)


@pytest.mark.parametrize("overrides, arch", [({**LLAMA, "n_kv_heads": 1, "use_bias": True}, "llama"),
                                             (dict(positions="rope", mlp="gelu"), "gpt_neox"),
                                             (dict(positions="learned", tie_embeddings=True), "celerity")])
def test_tensors_go_to_hf_and_back_unchanged_with_matrices_transposed(overrides, arch):
    cfg = dataclasses.replace(BASE, **overrides)
    folded = fold.fold(cfg, transformer.init_params(cfg, jax.random.key(0)))
    tensors = layouts.to_hf(cfg, arch, folded)
    assert {n: t.shape for n, t in tensors.items()} == layouts.expected_shapes(cfg, arch)
    back = layouts.from_hf(cfg, arch, tensors)
    assert back.keys() == folded.keys() and all(np.array_equal(back[p], folded[p]) for p in folded)
    if arch != "gpt_neox":
        names = {t.ours: t.name for t in layouts._names(cfg, arch)}
        np.testing.assert_array_equal(tensors[names["block_0/mlp/down/kernel"]], folded["block_0/mlp/down/kernel"].T)
        np.testing.assert_array_equal(tensors[names["embed"]], folded["embed"])
