"""Mixtures of experts exported at tiny shapes: Mixtral's routing goes to MixtralForCausalLM, every other to
CelerityForCausalLM; transformers (torch, float32) gives our full-sequence logits, and the import gives back every
parameter bit for bit."""

import dataclasses
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from celerity_jax.data.tokenizer import ByteTokenizer  # noqa: E402
from celerity_jax.errors import ConfigError  # noqa: E402
from celerity_jax.hf import export, fold, importer, layouts  # noqa: E402
from celerity_jax.model import transformer  # noqa: E402
from celerity_jax.model.config import ModelConfig  # noqa: E402

# CompleteP with multipliers that are no powers of two, so that the expert weights' folds lose bits.
BASE = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, vocab_size=257, max_seq_len=8, d_base=16,
                   n_layers_base=3, alpha_input=9.17, alpha_output=1.095, mlp_ratio=2.0, n_experts=4)
LLAMA = dict(positions="rope", norm="rmsnorm", mlp="swiglu")
MIXTRAL = dict(**LLAMA, experts_per_token=2, normalize_gates=True, capacity_factor=None)
CASES = {  # (class, the case's fields); capacity 1 or 0.5 drops routes of these tokens
    "mixtral_grouped_query": ("mixtral", dict(**MIXTRAL, n_kv_heads=1)),
    "celerity_hash_learned_gelu_bias": ("celerity", dict(router="hash", positions="learned", mlp="gelu",
                                                         use_bias=True, capacity_factor=1.0)),
    "celerity_topk_grouped_drops": ("celerity", dict(**LLAMA, experts_per_token=2, capacity_factor=1.0,
                                                     expert_group_len=4)),
    "celerity_topk_normalized_drops": ("celerity", {**MIXTRAL, "capacity_factor": 0.5}),
}


def _tokens(cfg: ModelConfig) -> np.ndarray:
    return np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.max_seq_len))


@pytest.mark.parametrize("overrides, arch", [
    # capacity ⌈factor × 8 positions × 2 routes / 4 experts⌉ at the longest sequence: 8 with 1.9 (no drop),
    # 6 with 1.5
    (MIXTRAL, "mixtral"), ({**MIXTRAL, "capacity_factor": 1.9}, "mixtral"),
    ({**MIXTRAL, "capacity_factor": 1.5}, "celerity"), ({**MIXTRAL, "normalize_gates": False}, "celerity"),
    ({**MIXTRAL, "use_bias": True}, "celerity"), ({**MIXTRAL, "mlp": "gelu"}, "celerity"),
    (dict(**LLAMA, router="hash", capacity_factor=None), "celerity")])
def test_only_mixtral_routing_goes_to_mixtral(overrides, arch):
    assert layouts.architecture(dataclasses.replace(BASE, **overrides)) == arch


def test_an_unknown_router_is_refused():
    cfg = dataclasses.replace(BASE)
    object.__setattr__(cfg, "router", "expert_choice")  # an option ModelConfig might gain later
    with pytest.raises(ConfigError, match=r"ModelConfig.router='expert_choice' has no exact Hugging Face export"):
        layouts.architecture(cfg)


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    arch, overrides = CASES[request.param]
    cfg = dataclasses.replace(BASE, **overrides)
    params = transformer.init_params(cfg, jax.random.key(0))
    out = str(tmp_path_factory.mktemp("hf") / request.param)
    summary = export.export(cfg, params, out, tokenizer=ByteTokenizer())
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    return arch, cfg, params, out, summary, hf_model.eval()


def test_full_sequence_logits_match(exported):
    arch, cfg, params, out, summary, hf_model = exported
    assert summary["class"] == layouts.CLASSES[arch] == type(hf_model).__name__
    ours, stats = transformer.apply(cfg, params, jnp.asarray(_tokens(cfg)), return_stats=True)
    dropped = np.asarray(stats["dropped"])
    assert (dropped > 0).all() if layouts.can_drop(cfg) else not dropped.any()  # the drop cases drop in each layer
    with open(os.path.join(out, "README.md")) as f:
        assert ("never dropped" in f.read()) == layouts.can_drop(cfg)
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(_tokens(cfg))).logits.numpy()
    assert np.abs(theirs - np.asarray(ours)).max() <= 1e-4


def _assert_same_bits(params, back):
    assert jax.tree.structure(back) == jax.tree.structure(params)
    original, back = fold.flatten(params), fold.flatten(back)
    assert all(np.array_equal(original[p].view(np.int32), back[p].view(np.int32)) for p in original)


def test_import_gives_back_every_parameter(exported):
    _, cfg, params, out, summary, _ = exported
    assert any("experts" in path for path in summary["lost_bits"])
    cfg_back, params_back, unfolded = importer.load(out)
    assert cfg_back == cfg and unfolded["stale_bits"] == []
    _assert_same_bits(params, params_back)


@pytest.mark.parametrize("exported", ["mixtral_grouped_query"], indirect=True)
def test_the_mixtral_export_is_what_transformers_saves(exported, tmp_path):
    _, cfg, params, out, _, hf_model = exported
    hf_model.save_pretrained(tmp_path)
    shutil.copy(os.path.join(out, fold.LOST_BITS), tmp_path)
    names = importer.stored_tensors(out)
    saved = importer.stored_tensors(str(tmp_path))
    assert sorted(saved) == sorted(names) and "model.layers.1.block_sparse_moe.experts.3.w2.weight" in saved
    ours, theirs = (importer.read_tensors(s, {n: n for n in s}) for s in (names, saved))
    assert all(np.array_equal(ours[n], theirs[n]) for n in ours)
    cfg_back, params_back, _ = importer.load(str(tmp_path))
    assert cfg_back == cfg
    _assert_same_bits(params, params_back)


@pytest.mark.parametrize("exported", ["celerity_topk_normalized_drops"], indirect=True)
def test_cached_decoding_dispatches_each_call_as_ours_does(exported):
    """A prefill of 7 tokens, then 1 decoded token alone in its call (never dropped): celerity_jax's cached
    decoding and the class give the same logits, which the drops make differ from the full sequence's."""
    _, cfg, params, _, _, hf_model = exported
    tokens_BxL = _tokens(cfg)
    positions_BxL = jnp.broadcast_to(jnp.arange(cfg.max_seq_len), tokens_BxL.shape)
    step = jax.jit(lambda tokens, cache, positions: transformer.apply_cached(cfg, params, tokens, cache, positions))
    cache = transformer.init_cache(cfg, 2, cfg.max_seq_len)
    past = None
    for call in (slice(0, 7), slice(7, 8)):
        ours, cache = step(jnp.asarray(tokens_BxL[:, call]), cache, positions_BxL[:, call])
        with torch.no_grad():
            output = hf_model(torch.from_numpy(tokens_BxL[:, call]), past_key_values=past, use_cache=True)
        past = output.past_key_values
        assert np.abs(output.logits.numpy() - np.asarray(ours)).max() <= 1e-4
    full = transformer.apply(cfg, params, jnp.asarray(tokens_BxL))
    assert np.abs(np.asarray(full[:, 7:]) - np.asarray(ours)).max() > 1e-2


@pytest.mark.parametrize("exported", ["celerity_topk_grouped_drops"], indirect=True)
def test_loaded_with_capacity_factor_none_the_class_drops_nothing(exported):
    _, cfg, params, out, _, _ = exported
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32,
                                                                 capacity_factor=None)
    ours = transformer.apply(dataclasses.replace(cfg, capacity_factor=None), params, jnp.asarray(_tokens(cfg)))
    with torch.no_grad():
        theirs = hf_model.eval()(torch.from_numpy(_tokens(cfg))).logits.numpy()
    assert np.abs(theirs - np.asarray(ours)).max() <= 1e-4
