"""Stock transformers models (LlamaForCausalLM, GPTNeoXForCausalLM) saved by transformers itself, imported as a
'standard' ModelConfig with every multiplier 1: our forward gives their logits, and a run directory of them loads."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from celerity_jax.cli import main  # noqa: E402
from celerity_jax.errors import ConfigError  # noqa: E402
from celerity_jax.evaluate import loader  # noqa: E402
from celerity_jax.hf import importer, tokenizer_files  # noqa: E402
from celerity_jax.model import transformer  # noqa: E402

SHAPE = dict(vocab_size=257, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
MODELS = {
    "llama": transformers.LlamaConfig(**SHAPE, intermediate_size=80, rms_norm_eps=1e-5, rope_theta=500.0),
    "llama_grouped_query": transformers.LlamaConfig(**SHAPE, num_key_value_heads=2, intermediate_size=80),
    "llama_tied_biased": transformers.LlamaConfig(**SHAPE, intermediate_size=64, tie_word_embeddings=True,
                                                  attention_bias=True, mlp_bias=True),
    "gpt_neox": transformers.GPTNeoXConfig(**SHAPE, intermediate_size=128, hidden_act="gelu_new", rotary_pct=1.0,
                                           use_parallel_residual=False),
}


def _save(config, folder, randomize_biases: bool = True):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and (randomize_biases or not name.endswith("bias")):
                p.add_(0.2 * torch.randn_like(p))  # norms and biases away from their init
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("name", list(MODELS))
def test_stock_logits_match(name, tmp_path):
    hf_model = _save(MODELS[name], tmp_path)
    cfg, params, _ = importer.load(str(tmp_path))
    assert cfg.parametrization == "standard" and cfg.tie_embeddings == MODELS[name].tie_word_embeddings
    tokens_BxL = np.random.default_rng(0).integers(0, 257, (2, 48))
    ours = np.asarray(transformer.apply(cfg, params, jnp.asarray(tokens_BxL)))
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens_BxL)).logits.numpy()
    assert np.abs(theirs - ours).max() <= 1e-4 * np.abs(ours).max()


def test_gpt_neox_without_attention_biases_needs_zero_biases(tmp_path):
    config = transformers.GPTNeoXConfig(**SHAPE, intermediate_size=128, rotary_pct=1.0, use_parallel_residual=False,
                                        attention_bias=False)
    _save(config, tmp_path / "zero", randomize_biases=False)
    assert not importer.load(str(tmp_path / "zero"))[0].use_bias
    _save(config, tmp_path / "nonzero")
    with pytest.raises(ConfigError, match="holds nonzero biases but the model has no attention biases"):
        importer.load(str(tmp_path / "nonzero"))


def test_stock_folder_as_a_run_directory(tmp_path, capsys):
    folder = tmp_path / "llama"
    _save(MODELS["llama"], folder)
    out = str(tmp_path / "run")
    assert main(["import-hf", "--model", str(folder), "--out", out]) == 2
    assert "has no tokenizer (tokenizer.json or tokenizer.model)" in capsys.readouterr().err
    tokenizer_files.byte_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    assert main(["import-hf", "--model", str(folder), "--out", out]) == 0
    model = loader.load_model(out)
    assert model.tokenizer.vocab_size == 257 and model.tokenizer.separator_id == 256
    assert model.cfg.norm == "rmsnorm" and model.cfg.d_ff == 80
