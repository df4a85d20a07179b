"""A Hugging Face folder as a ModelConfig and parameters, and those as a run directory.

Folders read: our own exports (config.json's `celerity_model` is the run's ModelConfig; the weights are unfolded
with its multipliers, see fold.py), and stock `llama` and `gpt_neox` models whose forward a ModelConfig computes
exactly: parametrization 'standard' with α_input = α_output = 1 and d_base, n_layers_base = the model's own width and
depth, so every multiplier is 1 but the stock 1/sqrt(head_dim). Anything else (partial
rotary, RoPE scaling, parallel residuals, biases on some projections only, another activation) is refused, naming
the config field. Llama's grouped-query attention (num_key_value_heads < num_attention_heads) is ModelConfig's
n_kv_heads.

The run directory (`import_folder`, through `run_start.write`) holds what `celerity eval`, `celerity sample` and TrainConfig.init_from read:
run.json and plan.json of the run it describes (the gin files given, with the model and tokenizer of the folder),
config.gin, model.gin (the ModelConfig and tokenizer bindings, to layer onto a training run's gin files), the
tokenizer file, and a checkpoint at step 0: the imported parameters, a fresh optimizer state (zero moments), an
empty collapse-monitor curve and the data iterator at its start. A run started from it with init_from (same
recipe gin and model.gin) begins at step 0 with these weights.
"""

import contextlib
import json
import os
import shutil
from typing import NamedTuple

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for bfloat16 safetensors)
import numpy as np

from celerity_jax.errors import ConfigError
from celerity_jax.hf import export, fold, layouts, outdir, tokenizer_files
from celerity_jax.model.config import ModelConfig

# transformers' activations that compute our ungated MLPs exactly.
OUR_ACTIVATIONS = {"relu2": "squared_relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
# Buffers older transformers saved beside the weights; they hold nothing a ModelConfig lacks.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias")
# Keys of an export's config.json that no computed value depends on: free to differ from what its celerity_model
# exports to (token ids, the dtype of the weights, where transformers finds the class).
_FREE_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "dtype", "use_cache", "architectures", "auto_map")
# Keys that transformers drops when it saves a config again, holding their values in rope_parameters.
_ROPE_KEYS = ("rope_theta", "rotary_pct", "rotary_emb_base")


def read_config(folder: str) -> dict:
    if not os.path.isdir(folder):
        raise ConfigError(f"--model {folder} is not a folder; give a Hugging Face model folder (config.json and "
                          "safetensors weights)")
    outdir.check_not_partial(folder, "--model")
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            hf = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--model {folder} has no config.json; give a complete Hugging Face model folder") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not readable JSON ({e}); give a complete Hugging Face model folder") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{path} holds a JSON {type(hf).__name__}, not a config object; give a complete Hugging "
                          "Face model folder")
    return hf


def _refuse(hf: dict, field: str, why: str):
    raise ConfigError(f"config.json: {field}={hf.get(field)!r} {why}, which no ModelConfig computes; import-hf "
                      "reads models it can reproduce exactly")


def _rope(hf: dict, default_fraction: float) -> float:
    """RoPE θ of a stock config; refuses scaled or partial rotary."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if params.get("rope_type", params.get("type", "default")) != "default":
        _refuse(hf, "rope_parameters" if "rope_parameters" in hf else "rope_scaling", "scales RoPE")
    if params.get("partial_rotary_factor", hf.get("rotary_pct", default_fraction)) != 1.0:
        _refuse(hf, "rotary_pct" if "rotary_pct" in hf else "rope_parameters", "rotates part of each head")
    return float(params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0))))


def _stock(hf: dict, **fields) -> ModelConfig:
    """The 'standard' ModelConfig with every multiplier 1 of a stock config's shape."""
    d, heads, layers = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    if d % heads:
        _refuse(hf, "hidden_size", f"is not a multiple of num_attention_heads={heads}")
    cfg = ModelConfig(n_layers=layers, d_model=d, n_heads=heads, head_dim=d // heads, vocab_size=hf["vocab_size"],
                      max_seq_len=hf["max_position_embeddings"], mlp_ratio=hf["intermediate_size"] / d,
                      positions="rope", tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                      parametrization="standard", alpha_input=1.0, alpha_output=1.0, d_base=d, n_layers_base=layers,
                      **fields)
    if cfg.d_ff != hf["intermediate_size"]:
        _refuse(hf, "intermediate_size", "is no whole-number MLP width of this hidden_size")
    return cfg


def _check_sizes(hf: dict) -> None:
    """A stock config's sizes are positive integers."""
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "max_position_embeddings"):
        if type(hf[field]) is not int or hf[field] < 1:
            _refuse(hf, field, "is not a positive integer")


def _llama(hf: dict) -> ModelConfig:
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        _refuse(hf, "num_key_value_heads", f"does not divide num_attention_heads={heads}")
    if hf.get("head_dim") not in (None, hf["hidden_size"] // heads):
        _refuse(hf, "head_dim", "is not hidden_size / num_attention_heads")
    if hf.get("hidden_act", "silu") != "silu":
        _refuse(hf, "hidden_act", "is not SwiGLU's silu")
    if bool(hf.get("attention_bias", False)) != bool(hf.get("mlp_bias", False)):
        _refuse(hf, "attention_bias", f"differs from mlp_bias={hf.get('mlp_bias', False)} (biases on some "
                                      "projections only)")
    return _stock(hf, norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)), mlp="swiglu",
                  rope_theta=_rope(hf, 1.0), use_bias=bool(hf.get("attention_bias", False)),
                  n_kv_heads=None if kv_heads == heads else kv_heads)


def _gpt_neox(hf: dict) -> ModelConfig:
    if hf.get("use_parallel_residual", True):
        _refuse(hf, "use_parallel_residual", "runs attention and MLP in parallel")
    if hf.get("hidden_act", "gelu") not in OUR_ACTIVATIONS:
        _refuse(hf, "hidden_act", f"is none of {', '.join(OUR_ACTIVATIONS)}")
    return _stock(hf, norm="layernorm", norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
                  mlp=OUR_ACTIVATIONS[hf.get("hidden_act", "gelu")], rope_theta=_rope(hf, 0.25),
                  use_bias=bool(hf.get("attention_bias", True)))


def _check_as_exported(hf: dict, cfg: ModelConfig, arch: str) -> None:
    """An export's config.json holds what its celerity_model `cfg` exports to, so that transformers computes the
    model that import-hf reads; else one ConfigError line naming the first key that differs."""
    exported = layouts.hf_config(cfg, arch, dtype="float32", eos_id=0)  # both free keys
    for key, value in exported.items():
        if key in _FREE_KEYS or (key in _ROPE_KEYS and key not in hf and "rope_parameters" in hf):
            continue
        if key not in hf or hf[key] != value:
            found = f"{key}={hf[key]!r}" if key in hf else f"no {key}"
            raise ConfigError(f"config.json: {found}, but its celerity_model (which the weights fit) exports "
                              f"{key}={value!r}; config.json was changed after the export: restore it, or export "
                              "the run again")


def model_config(hf: dict) -> tuple[ModelConfig, str]:
    """(ModelConfig, architecture) of a config.json."""
    model_type = hf.get("model_type")
    if "celerity_model" in hf:
        try:
            cfg = ModelConfig(**hf["celerity_model"])
        except (TypeError, ConfigError) as e:
            raise ConfigError(f"config.json: celerity_model is not a ModelConfig of this version ({e}); import with "
                              "the celerity_jax version that exported it") from None
        return cfg, layouts.architecture(cfg)
    try:
        if model_type in ("llama", "gpt_neox"):
            _check_sizes(hf)
        if model_type == "llama":
            return _llama(hf), "llama"
        if model_type == "gpt_neox":
            return _gpt_neox(hf), "gpt_neox"
    except KeyError as e:
        raise ConfigError(f"config.json lacks {e.args[0]!r}; give a complete {model_type} config") from None
    except ConfigError as e:
        if str(e).startswith("config.json"):
            raise
        raise ConfigError(f"config.json: the {model_type} shape has no ModelConfig ({e})") from None
    raise ConfigError(f"config.json: model_type={model_type!r} is not importable; import-hf reads celerity_jax "
                      "exports and stock llama and gpt_neox models")


@contextlib.contextmanager
def _safetensors(path: str):
    """The safetensors file at `path`, opened; a damaged file is one ConfigError line."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="np") as f:
            yield f
    except Exception as e:  # safetensors raises its own error types for truncated or foreign files
        raise ConfigError(f"{path} is not a readable safetensors file ({e}); copy the file again") from None


class StoredTensor(NamedTuple):
    file: str
    shape: tuple[int, ...]


def stored_tensors(folder: str) -> dict[str, StoredTensor]:
    """{name: its file and shape} of every tensor of the folder's safetensors (one file, or the shards its index
    names), read from the files' headers: no tensor is loaded."""
    index = os.path.join(folder, export.INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                files = sorted({str(file) for file in json.load(f)["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{index} is not a safetensors index ({e}); give a complete model folder") from None
    elif os.path.isfile(os.path.join(folder, export.SINGLE_FILE)):
        files = [export.SINGLE_FILE]
    else:
        raise ConfigError(f"--model {folder} has neither {export.SINGLE_FILE} nor {export.INDEX_FILE}; give a folder "
                          "with safetensors weights")
    stored = {}
    for file in files:
        path = os.path.join(folder, file)
        if not os.path.isfile(path):
            raise ConfigError(f"--model {folder}: the weight file {file} named by its index is missing; copy the "
                              "whole folder")
        with _safetensors(path) as f:
            stored.update({name: StoredTensor(path, tuple(f.get_slice(name).get_shape())) for name in f.keys()})
    return stored


def check_tensors(cfg: ModelConfig, arch: str, stored: dict[str, StoredTensor]) -> dict[str, str]:
    """{name of a tensor `cfg` reads: the name it is stored under}, each checked for presence and shape; a stored
    tensor it has no place for is refused."""
    names = {name: name for name in stored}
    if "embed_out.weight" in stored and "lm_head.weight" not in stored:  # GPT-NeoX as transformers 4 saved it
        names = {("lm_head.weight" if name == "embed_out.weight" else name): name for name in stored}
    expected = layouts.expected_shapes(cfg, arch)
    unexpected = sorted(n for n in names if n not in expected and not n.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        raise ConfigError(f"tensor {unexpected[0]} (and {len(unexpected) - 1} more) has no place in the model "
                          f"config.json describes ({len(expected)} tensors); the folder's weights and config.json "
                          "do not belong together")
    for name, shape in expected.items():
        if name not in names:
            if name == "lm_head.weight" and cfg.tie_embeddings:
                continue
            raise ConfigError(f"tensor {name} is missing from the weights; give a complete model folder")
        if stored[names[name]].shape != tuple(shape):
            raise ConfigError(f"tensor {name} has shape {stored[names[name]].shape}, but config.json makes it "
                              f"{tuple(shape)} (vocab_size {cfg.vocab_size}, hidden {cfg.d_model}); the weights and "
                              "config.json do not belong together")
    return {name: names[name] for name in expected if name in names}


def read_tensors(stored: dict[str, StoredTensor], names: dict[str, str]) -> dict[str, np.ndarray]:
    """{name: tensor} of the tensors `names` maps to their stored names."""
    tensors = {}
    for file in sorted({stored[s].file for s in names.values()}):
        with _safetensors(file) as f:
            tensors.update({name: f.get_tensor(s) for name, s in names.items() if stored[s].file == file})
    return tensors


def load(folder: str) -> tuple[ModelConfig, dict, dict]:
    """(ModelConfig, float32 parameters in its layout, {"lost_bits": leaves unfolded with the export's lost bits,
    "stale_bits": leaves whose weights changed since the export}) of a Hugging Face folder, checked."""
    hf = read_config(folder)
    cfg, arch = model_config(hf)
    stored = stored_tensors(folder)
    names = check_tensors(cfg, arch, stored)
    if "celerity_model" in hf:  # after the shapes: weights that fit celerity_model show that the rest changed
        _check_as_exported(hf, cfg, arch)
    tensors = read_tensors(stored, names)
    folded = layouts.from_hf(cfg, arch, tensors)
    lost, stale = {}, []
    if os.path.isfile(os.path.join(folder, fold.LOST_BITS)):
        lost, stale = fold.load_lost_bits(os.path.join(folder, fold.LOST_BITS), cfg, folded)
    params = fold.unflatten(fold.unfold(cfg, folded, lost))
    if cfg.scan_layers:
        blocks = [params.pop(f"block_{i}") for i in range(cfg.n_layers)]
        params["blocks"] = jax.tree.map(lambda *layers: np.stack(layers), *blocks)
    return cfg, params, {"lost_bits": sorted(lost), "stale_bits": stale}


def tokenizer_spec(folder: str, hf: dict) -> tuple[str, str, str | None]:
    """(DataConfig.tokenizer for the run: 'byte' or a file name in the folder, separator_token, the file to copy)."""
    if hf.get("celerity_tokenizer") == "byte":
        return "byte", "", None
    for name in (tokenizer_files.TOKENIZER_JSON, tokenizer_files.SENTENCEPIECE_MODEL):
        if os.path.isfile(os.path.join(folder, name)):
            eos = tokenizer_files.eos_token(folder) if name == tokenizer_files.TOKENIZER_JSON else ""
            return name, eos, name
    raise ConfigError(f"--model {folder} has no tokenizer ({tokenizer_files.TOKENIZER_JSON} or "
                      f"{tokenizer_files.SENTENCEPIECE_MODEL}); a run needs one to sample and evaluate: copy it in")


def import_folder(folder: str, out: str, gin_files=(), gin_params=()) -> dict:
    """Reads the folder and writes the run directory `out` (new or empty). Returns what was written."""
    from celerity_jax.hf import run_start

    outdir.check_empty(out, "--out")
    cfg, params, unfolded = load(folder)
    hf = read_config(folder)
    tokenizer, separator, copy = tokenizer_spec(folder, hf)
    with outdir.building(out, "--out") as partial:
        if copy:
            shutil.copyfile(os.path.join(folder, copy), os.path.join(partial, copy))
        final = tokenizer if copy is None else os.path.join(os.path.abspath(out), copy)
        summary = run_start.write(partial, cfg, params, tokenizer=final, separator_token=separator,
                                  tokenizer_now=tokenizer if copy is None else os.path.join(folder, copy),
                                  gin_files=gin_files, gin_params=gin_params)
    return {"out": out, "model_type": hf.get("model_type"), **summary, **unfolded}
