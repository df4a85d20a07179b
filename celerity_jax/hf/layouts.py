"""Which transformers class holds a ModelConfig, its config.json, and the names and layouts of its tensors.

- RoPE + RMSNorm + SwiGLU → `LlamaForCausalLM` (rotate_half is our two-halves RoPE; down(silu(gate)·up); RMSNorm
  without bias; biases on every projection or none: attention_bias = mlp_bias = use_bias).
- RoPE + LayerNorm + an ungated MLP → `GPTNeoXForCausalLM` with rotary on the whole head, sequential residuals,
  the fused head-major q|k|v projection; its LayerNorms and MLP always have biases, zero without use_bias.
- everything else (ALiBi, learned positions, the other combinations) → `CelerityForCausalLM`, shipped beside the
  weights (`modeling_celerity.py`, trust_remote_code=True).
  GPT-NeoX has no grouped-query attention: a model with fewer key/value heads than heads goes to Celerity's class.
All three scale scores by 1/sqrt(head_dim) and hold an untied lm_head: the multipliers are folded first (fold.py).
Flax Dense kernels are [in, out], torch Linear weights [out, in]; our unembed is [D, V], lm_head.weight [V, D]: every
declared matrix but the embeddings is transposed.
"""

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from celerity_jax.errors import ConfigError
from celerity_jax.hf import fold
from celerity_jax.model import transformer
from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig

CLASSES = {"llama": "LlamaForCausalLM", "gpt_neox": "GPTNeoXForCausalLM", "celerity": "CelerityForCausalLM"}
# transformers' activation names (ACT2FN) of our ungated MLPs.
HF_ACTIVATIONS = {"squared_relu": "relu2", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
# What each architecture field may hold for the export to be exact; an option added to ModelConfig later is refused
# until the export learns it.
EXPORTABLE = {"norm": ("layernorm", "rmsnorm"), "mlp": ("squared_relu", "swiglu", "gelu", "gelu_tanh"),
              "positions": ("alibi", "rope", "learned")}
# ModelConfig fields that change no computed value of float32 inference (how it runs, not what).
EXECUTION_FIELDS = ("compute_dtype", "residual_dtype", "attention_impl", "dense_backward", "logits_chunk_len",
                    "scan_layers", "remat")
# Fields the export reads (into the multipliers, the config.json or the shapes).
ARCHITECTURE_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "max_seq_len", "norm",
                       "norm_eps", "mlp", "mlp_ratio", "positions", "rope_theta", "tie_embeddings", "use_bias",
                       "parametrization", "depth_alpha", "d_base", "n_layers_base", "sigma_base", "alpha_input",
                       "alpha_output")


def architecture(cfg: ModelConfig) -> str:
    """"llama", "gpt_neox" or "celerity"; ConfigError for a model the export cannot reproduce exactly."""
    for name, allowed in EXPORTABLE.items():
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"ModelConfig.{name}={getattr(cfg, name)!r} has no exact Hugging Face export (it knows "
                              f"{', '.join(allowed)}); export a model with one of those")
    unknown = [f.name for f in dataclasses.fields(cfg)
               if f.name not in ARCHITECTURE_FIELDS + EXECUTION_FIELDS and getattr(cfg, f.name) != f.default]
    if unknown:
        raise ConfigError(f"ModelConfig.{unknown[0]}={getattr(cfg, unknown[0])!r} is not known to the Hugging Face "
                          "export, which would drop it; export a model that leaves it at its default")
    if cfg.positions == "rope" and cfg.norm == "rmsnorm" and cfg.mlp == "swiglu":
        return "llama"
    if cfg.positions == "rope" and cfg.norm == "layernorm" and cfg.mlp != "swiglu" and cfg.kv_heads == cfg.n_heads:
        return "gpt_neox"
    return "celerity"


def hf_config(cfg: ModelConfig, arch: str, *, dtype: str, eos_id: int) -> dict:
    """config.json of the export (without the celerity_* keys)."""
    common = {"architectures": [CLASSES[arch]], "model_type": arch, "vocab_size": cfg.vocab_size,
              "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
              "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_seq_len,
              "tie_word_embeddings": False, "bos_token_id": eos_id, "eos_token_id": eos_id, "dtype": dtype,
              "use_cache": True}
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if arch == "llama":
        return {**common, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
                "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta, "rope_parameters": rope,
                "attention_bias": cfg.use_bias, "mlp_bias": cfg.use_bias, "attention_dropout": 0.0,
                "pretraining_tp": 1}
    if arch == "gpt_neox":
        return {**common, "hidden_act": HF_ACTIVATIONS[cfg.mlp], "layer_norm_eps": cfg.norm_eps,
                "use_parallel_residual": False, "rotary_pct": 1.0, "rotary_emb_base": cfg.rope_theta,
                "rope_parameters": {**rope, "partial_rotary_factor": 1.0}, "attention_bias": cfg.use_bias,
                "attention_dropout": 0.0, "hidden_dropout": 0.0}
    return {**common, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "norm": cfg.norm, "norm_eps": cfg.norm_eps, "mlp": cfg.mlp,
            "positions": cfg.positions, "rope_theta": cfg.rope_theta, "use_bias": cfg.use_bias,
            "auto_map": {"AutoConfig": "configuration_celerity.CelerityConfig",
                         "AutoModelForCausalLM": "modeling_celerity.CelerityForCausalLM"}}


class Tensor(NamedTuple):
    """One HF tensor: our flat path, its HF name, and its width when the HF class holds it whatever the model does
    (GPT-NeoX's LayerNorm and MLP biases: zeros without use_bias), else None."""
    ours: str
    name: str
    always_width: int | None = None


def _names(cfg: ModelConfig, arch: str) -> list[Tensor]:
    """Every tensor but GPT-NeoX's fused q|k|v, whether or not the model holds it (biases)."""
    if arch == "gpt_neox":
        top, layer = "gpt_neox.", "gpt_neox.layers.{i}."
        embed, final = "embed_in", "final_layer_norm"
        parts = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm", "attn/o": "attention.dense",
                 "mlp/up": "mlp.dense_h_to_4h", "mlp/down": "mlp.dense_4h_to_h"}
        always = {"input_layernorm": cfg.d_model, "post_attention_layernorm": cfg.d_model,
                  "mlp.dense_h_to_4h": cfg.d_ff, "mlp.dense_4h_to_h": cfg.d_model, final: cfg.d_model}
    else:
        top, layer = "model.", "model.layers.{i}."
        embed, final = "embed_tokens", "norm"
        llama = arch == "llama"
        parts = {"attn_norm": "input_layernorm" if llama else "attn_norm",
                 "mlp_norm": "post_attention_layernorm" if llama else "mlp_norm",
                 **{f"attn/{p}": f"{'self_attn' if llama else 'attn'}.{p}_proj" for p in "qkvo"},
                 **{f"mlp/{p}": f"mlp.{p}_proj" for p in ("up", "gate", "down")}}
        always = {}
    names = [Tensor("embed", f"{top}{embed}.weight"), Tensor("unembed", "lm_head.weight"),
             Tensor("final_norm/scale", f"{top}{final}.weight"),
             Tensor("final_norm/bias", f"{top}{final}.bias", always.get(final))]
    if arch == "celerity":
        names.append(Tensor("pos_embed", "model.embed_positions.weight"))
    for i in range(cfg.n_layers):
        for ours, theirs in parts.items():
            weight = "scale" if ours.endswith("_norm") else "kernel"
            names.append(Tensor(f"block_{i}/{ours}/{weight}", f"{layer.format(i=i)}{theirs}.weight"))
            names.append(Tensor(f"block_{i}/{ours}/bias", f"{layer.format(i=i)}{theirs}.bias", always.get(theirs)))
    return names


def _transposed(cfg: ModelConfig, path: str) -> bool:
    """Whether the HF tensor is our leaf transposed: every declared matrix but the embeddings."""
    declared = fold.declarations(cfg).get(path)
    return declared is not None and declared.is_matrix and declared.role is not Role.EMBEDDING


def to_hf(cfg: ModelConfig, arch: str, folded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The HF tensors of folded flat leaves (fold.fold's)."""
    out = {}
    for tensor in _names(cfg, arch):
        if tensor.ours in folded:
            x = folded[tensor.ours]
            out[tensor.name] = np.ascontiguousarray(x.T if _transposed(cfg, tensor.ours) else x)
        elif tensor.always_width:
            out[tensor.name] = np.zeros(tensor.always_width, np.float32)
    if arch == "gpt_neox":
        h, k, d = cfg.n_heads, cfg.head_dim, cfg.d_model
        for i in range(cfg.n_layers):
            attn, name = f"block_{i}/attn", f"gpt_neox.layers.{i}.attention.query_key_value"
            w_Hx3xKxD = np.stack([folded[f"{attn}/{p}/kernel"].T.reshape(h, k, d) for p in "qkv"], axis=1)
            out[f"{name}.weight"] = w_Hx3xKxD.reshape(3 * h * k, d)
            if cfg.use_bias:
                out[f"{name}.bias"] = np.stack([folded[f"{attn}/{p}/bias"].reshape(h, k) for p in "qkv"],
                                               axis=1).reshape(3 * h * k)
    return out


def expected_shapes(cfg: ModelConfig, arch: str) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name the export of `cfg` writes, with its shape (nothing allocated)."""
    unscanned = dataclasses.replace(cfg, scan_layers=False)
    abstract = jax.eval_shape(lambda: transformer.init_params(unscanned, jax.random.key(0)))
    ours = {path: x.shape for path, x in fold.flat_tree(abstract).items()}
    if cfg.tie_embeddings:
        ours[fold.tied_unembed(cfg)] = ours[fold.token_embedding(cfg)][::-1]
    shapes = {}
    for tensor in _names(cfg, arch):
        if tensor.ours in ours:
            shape = ours[tensor.ours]
            shapes[tensor.name] = shape[::-1] if _transposed(cfg, tensor.ours) else shape
        elif tensor.always_width:
            shapes[tensor.name] = (tensor.always_width,)
    if arch == "gpt_neox":
        for i in range(cfg.n_layers):
            name = f"gpt_neox.layers.{i}.attention.query_key_value"
            shapes[f"{name}.weight"] = (3 * cfg.d_model, cfg.d_model)
            if cfg.use_bias:
                shapes[f"{name}.bias"] = (3 * cfg.d_model,)
    return shapes


def from_hf(cfg: ModelConfig, arch: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Folded flat leaves from HF tensors already checked against `expected_shapes`. GPT-NeoX's bias tensors that
    `cfg` has no place for must be zero; a tied model's lm_head may be absent."""
    folded = {}
    for tensor in _names(cfg, arch):
        if tensor.name not in tensors:
            continue
        x = np.asarray(tensors[tensor.name])
        if tensor.always_width and not cfg.use_bias:
            if np.any(x.astype(np.float32)):
                raise ConfigError(f"tensor {tensor.name} holds nonzero biases but the model has no attention biases "
                                  "(attention_bias false); a model with biases on some projections only has no "
                                  "ModelConfig")
            continue
        folded[tensor.ours] = x.T if _transposed(cfg, tensor.ours) else x
    if arch == "gpt_neox":
        h, k, d = cfg.n_heads, cfg.head_dim, cfg.d_model
        for i in range(cfg.n_layers):
            attn, name = f"block_{i}/attn", f"gpt_neox.layers.{i}.attention.query_key_value"
            w_Hx3xKxD = np.asarray(tensors[f"{name}.weight"]).reshape(h, 3, k, d)
            for j, p in enumerate("qkv"):
                folded[f"{attn}/{p}/kernel"] = w_Hx3xKxD[:, j].reshape(h * k, d).T
                if cfg.use_bias:
                    b_Hx3xK = np.asarray(tensors[f"{name}.bias"]).reshape(h, 3, k)
                    folded[f"{attn}/{p}/bias"] = b_Hx3xK[:, j].reshape(h * k)
    return folded
