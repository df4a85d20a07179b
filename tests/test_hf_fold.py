"""The fold reads each parameter's declared multiplier; fold then unfold gives back every float32 value with the lost
bits, and within one ulp without them."""

import dataclasses
import math

import jax
import numpy as np
import pytest

from celerity_jax.hf import fold
from celerity_jax.model import transformer
from celerity_jax.model.config import ModelConfig

# α_in 9.17, α_out/m_d = 1.095/1.5, m_L^-1 = 1/1.5: no powers of two.
CFG = ModelConfig(n_layers=3, d_model=24, n_heads=2, head_dim=12, vocab_size=31, max_seq_len=8, d_base=16,
                  n_layers_base=2, alpha_input=9.17, alpha_output=1.095, positions="learned", use_bias=True,
                  mlp="swiglu", n_kv_heads=1)


def test_each_leaf_gets_the_multiplier_it_declares():
    c = fold.constants(CFG)
    assert c["query"] == pytest.approx(1 / math.sqrt(12)) and c["residual"] == pytest.approx(2 / 3)
    expected = {"embed": c["input"], "pos_embed": c["input"], "unembed": c["output"],
                "block_1/attn/q/kernel": c["query"], "block_1/attn/q/bias": c["query"],
                "block_1/attn/k/kernel": 1.0, "block_1/attn/v/bias": 1.0,
                "block_1/attn/o/kernel": c["residual"], "block_1/attn/o/bias": c["residual"],
                "block_1/mlp/down/kernel": c["residual"], "block_1/mlp/up/kernel": 1.0,
                "block_1/mlp/gate/bias": 1.0, "block_1/attn_norm/scale": 1.0, "final_norm/bias": 1.0}
    assert {path: fold.leaf_factor(CFG, path) for path in expected} == pytest.approx(expected)
    assert set(fold.declarations(CFG)) == set(fold.flatten(transformer.init_params(CFG, jax.random.key(0))))


def test_a_tied_embedding_is_exported_as_its_own_unembedding_with_the_output_multiplier():
    tied = dataclasses.replace(CFG, tie_embeddings=True)
    params = transformer.init_params(tied, jax.random.key(0))
    folded = fold.fold(tied, params)
    c = fold.constants(tied)
    np.testing.assert_array_equal(folded["unembed"], fold.fold_array(np.asarray(params["embed"]).T, c["output"]))
    assert fold.token_embedding(tied) == "embed" and fold.tied_unembed(tied) == "unembed"
    back = fold.unfold(tied, folded, fold.lost_bits(tied, params, folded))
    assert "unembed" not in back and np.array_equal(back["embed"].view(np.int32),
                                                    np.asarray(params["embed"]).view(np.int32))


def test_unfold_is_bit_exact_with_the_lost_bits_and_one_ulp_off_at_most_without():
    params = transformer.init_params(CFG, jax.random.key(1))
    folded = fold.fold(CFG, params)
    masks = fold.lost_bits(CFG, params, folded)
    original = fold.flatten(params)
    exact, alone = fold.unfold(CFG, folded, masks), fold.unfold(CFG, folded)
    assert masks and set(masks) <= {p for p in original if fold.leaf_factor(CFG, p) != 1.0}
    for path, x in original.items():
        assert np.array_equal(exact[path].view(np.int32), x.view(np.int32)), path
        ulps = np.abs(alone[path].view(np.int32).astype(np.int64) - x.view(np.int32)).max()
        assert ulps == (1 if path in masks else 0), path


def test_lost_bits_saved_and_loaded_apply_only_to_unchanged_weights(tmp_path):
    params = transformer.init_params(CFG, jax.random.key(2))
    folded = fold.fold(CFG, params)
    masks = fold.lost_bits(CFG, params, folded)
    file = str(tmp_path / fold.LOST_BITS)
    fold.save_lost_bits(file, CFG, masks, folded)
    loaded, stale = fold.load_lost_bits(file, CFG, folded)
    assert stale == [] and all(np.array_equal(loaded[p], masks[p]) for p in masks)
    assert "embed" in masks  # α_input 9.17 folds pairs of float32 values into one
    _, stale = fold.load_lost_bits(file, CFG, dict(folded, embed=folded["embed"] + 1.0))
    assert stale == ["embed"]
