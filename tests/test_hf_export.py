"""Every architecture a ModelConfig expresses, exported at tiny shapes: transformers (torch, float32) gives our logits
and our greedy tokens, and the import gives back every float32 parameter bit for bit (from the weights alone: exact
where the fold is injective, one ulp off at most elsewhere)."""

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
from celerity_jax.evaluate import sampler  # noqa: E402
from celerity_jax.hf import export, fold, importer, layouts  # noqa: E402
from celerity_jax.model import sharding, transformer  # noqa: E402
from celerity_jax.model.config import ModelConfig  # noqa: E402

# CompleteP with multipliers that are no powers of two: α_in 9.17, α_out/m_d = 1.095/1.5, m_L^-1 = 1.5.
BASE = dict(n_layers=2, d_model=32, n_heads=2, head_dim=16, vocab_size=257, max_seq_len=32, d_base=16,
            n_layers_base=3, alpha_input=9.17, alpha_output=1.095, mlp_ratio=4.0)
CASES = {
    "celerity": ("celerity", dict(d_model=48, n_heads=3)),  # ALiBi's slopes for 3 heads: the non-power-of-two recipe
    "celerity_alibi_rmsnorm_swiglu": ("celerity", dict(norm="rmsnorm", mlp="swiglu")),
    "celerity_learned_gelu_tanh_bias_tied": ("celerity", dict(positions="learned", mlp="gelu_tanh", use_bias=True,
                                                              tie_embeddings=True)),
    "celerity_rope_rmsnorm_gelu": ("celerity", dict(positions="rope", norm="rmsnorm", mlp="gelu")),
    "celerity_rope_layernorm_swiglu_bias": ("celerity", dict(positions="rope", mlp="swiglu", use_bias=True)),
    "llama": ("llama", dict(positions="rope", norm="rmsnorm", mlp="swiglu", head_dim=8, n_heads=4)),
    "llama_bias_tied_scanned": ("llama", dict(positions="rope", norm="rmsnorm", mlp="swiglu", use_bias=True,
                                              tie_embeddings=True, scan_layers=True, rope_theta=500.0)),
    "llama_grouped_query": ("llama", dict(positions="rope", norm="rmsnorm", mlp="swiglu", head_dim=8, n_heads=4,
                                          n_kv_heads=2)),
    "celerity_alibi_grouped_query": ("celerity", dict(head_dim=8, n_heads=4, n_kv_heads=1)),
    "gpt_neox_gelu": ("gpt_neox", dict(positions="rope", mlp="gelu")),
    "gpt_neox_relu2_bias": ("gpt_neox", dict(positions="rope", mlp="squared_relu", use_bias=True, head_dim=8,
                                             n_heads=4)),
    "gpt_neox_gelu_tanh_mup": ("gpt_neox", dict(positions="rope", mlp="gelu_tanh", parametrization="mup")),
}


def _model(overrides: dict):
    cfg = ModelConfig(**{**BASE, **overrides})
    params = transformer.init_params(cfg, jax.random.key(0))
    # norm gains and biases away from their constant init, so that every tensor's place is checked
    noise = lambda path, x: x + 0.2 * jax.random.normal(jax.random.key(len(jax.tree_util.keystr(path))), x.shape)
    return cfg, jax.tree_util.tree_map_with_path(
        lambda path, x: noise(path, x) if str(path[-1].key) in ("scale", "bias") else x, params)


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    arch, overrides = CASES[request.param]
    cfg, params = _model(overrides)
    out = str(tmp_path_factory.mktemp("hf") / request.param)
    summary = export.export(cfg, params, out, tokenizer=ByteTokenizer())
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    return arch, cfg, params, out, summary, hf_model.eval()


def test_class_and_files(exported):
    arch, cfg, _, out, summary, hf_model = exported
    assert summary["class"] == layouts.CLASSES[arch] == type(hf_model).__name__
    remote = {"configuration_celerity.py", "modeling_celerity.py"} <= set(os.listdir(out))
    assert remote == (arch == "celerity")
    assert not hf_model.config.tie_word_embeddings


def test_logits_match(exported):
    _, cfg, params, _, _, hf_model = exported
    tokens_BxL = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.max_seq_len))
    ours = np.asarray(transformer.apply(cfg, params, jnp.asarray(tokens_BxL)))
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens_BxL)).logits.numpy()
    assert np.abs(theirs - ours).max() <= 1e-4 * np.abs(ours).max()


def test_greedy_generation_matches(exported):
    _, cfg, params, _, _, hf_model = exported
    unscanned, params = transformer.unstack_layers(cfg, params)
    prompts = [[5, 80, 33, 101, 7], [200, 3, 3, 64, 9, 12, 150, 40, 2]]
    decoder = sampler.Decoder(unscanned, params, sharding.make_mesh((-1, 1, 1)))
    ours = sampler.generate(decoder, ByteTokenizer(), prompts, max_new_tokens=10)
    for prompt, generation in zip(prompts, ours):
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=len(generation.token_ids), do_sample=False)
        assert out[0, len(prompt):].tolist() == generation.token_ids


def _bits(params) -> dict[str, np.ndarray]:
    return {path: x.view(np.int32) for path, x in fold.flatten(params).items()}


def test_import_is_bit_identical(exported):
    _, cfg, params, out, _, _ = exported
    cfg_back, params_back, unfolded = importer.load(out)
    assert cfg_back == cfg and unfolded["stale_bits"] == []
    assert jax.tree.structure(params_back) == jax.tree.structure(params)
    original, back = _bits(params), _bits(params_back)
    assert all(np.array_equal(original[p], back[p]) for p in original)


def test_import_from_the_weights_alone(exported, tmp_path):
    """Without the lost bits, leaves folded by a power of two come back bit for bit, the others within one ulp."""
    _, cfg, params, out, summary, _ = exported
    folder = tmp_path / "weights_only"
    folder.mkdir()
    for name in os.listdir(out):
        if name != fold.LOST_BITS:
            os.symlink(os.path.join(out, name), folder / name)
    _, params_back, unfolded = importer.load(str(folder))
    assert unfolded["lost_bits"] == []
    unscanned, params = transformer.unstack_layers(cfg, params)
    original = _bits(params)
    back = _bits(transformer.unstack_layers(cfg, params_back)[1])
    for path in original:
        ulps = np.abs(original[path].astype(np.int64) - back[path]).max()
        assert ulps == (1 if path in summary["lost_bits"] else 0), path
        if not (path == "embed" and cfg.tie_embeddings) and np.log2(fold.leaf_factor(unscanned, path)).is_integer():
            assert path not in summary["lost_bits"]


def test_the_config_saved_again_by_transformers_imports(exported, tmp_path):
    """transformers writes config.json its own way (it drops rope_theta where rope_parameters holds it, adds its
    defaults): the import still finds it to hold what its celerity_model exports to."""
    _, cfg, _, out, _, hf_model = exported
    folder = tmp_path / "saved_again"
    shutil.copytree(out, folder)
    os.remove(folder / "config.json")
    hf_model.config.save_pretrained(folder)
    assert importer.load(str(folder))[0] == cfg


def test_bfloat16_export_loads_close(tmp_path):
    cfg, params = _model(CASES["celerity"][1])
    out = str(tmp_path / "bf16")
    summary = export.export(cfg, params, out, tokenizer=ByteTokenizer(), dtype="bfloat16")
    assert summary["lost_bits"] == {} and not os.path.exists(os.path.join(out, fold.LOST_BITS))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    tokens_BxL = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 16))
    ours = np.asarray(transformer.apply(cfg, params, jnp.asarray(tokens_BxL)))
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens_BxL)).logits.numpy()
    assert np.abs(theirs - ours).max() <= 5e-2 * np.abs(ours).max()
    _, back, _ = importer.load(out)
    assert all(np.allclose(b, a, rtol=1e-2, atol=1e-3)
               for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)))


def test_how_a_model_ran_does_not_stop_its_export():
    cfg, _ = _model({})
    for field, value in (("residual_dtype", "bfloat16"), ("remat", "attention"), ("compute_dtype", "bfloat16")):
        assert layouts.architecture(dataclasses.replace(cfg, **{field: value})) == layouts.architecture(cfg)


def test_an_option_the_export_does_not_know_is_refused(tmp_path):
    cfg, params = _model({})
    unknown = dataclasses.replace(cfg)
    object.__setattr__(unknown, "mlp", "geglu")  # an option ModelConfig might gain later
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"ModelConfig.mlp='geglu' has no exact Hugging Face export"):
        export.export(unknown, params, str(out), tokenizer=ByteTokenizer())
    assert not out.exists() and os.listdir(tmp_path) == []
