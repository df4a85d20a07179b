"""Which transformers class holds a ModelConfig, its config.json, and the names and layouts of its tensors.

- RoPE + RMSNorm + SwiGLU → `LlamaForCausalLM` (rotate_half is our two-halves RoPE; down(silu(gate)·up); RMSNorm
  without bias; biases on every projection or none: attention_bias = mlp_bias = use_bias).
- RoPE + LayerNorm + an ungated MLP → `GPTNeoXForCausalLM` with rotary on the whole head, sequential residuals,
  the fused head-major q|k|v projection; its LayerNorms and MLP always have biases, zero without use_bias.
- a mixture of experts that is Llama's shape without biases, its router top-k with normalized gates and no route
  ever dropped (every expert's capacity the whole sequence) → `MixtralForCausalLM`, its experts saved one tensor
  each (w1 gate, w3 up, w2 down), as transformers saves a Mixtral.
- everything else (ALiBi, learned positions, the other combinations, every other mixture of experts) →
  `CelerityForCausalLM`, shipped beside the weights (`modeling_celerity.py`, trust_remote_code=True).
  GPT-NeoX has no grouped-query attention: a model with fewer key/value heads than heads goes to Celerity's class.
All four scale scores by 1/sqrt(head_dim) and hold an untied lm_head: the multipliers are folded first (fold.py).
Flax Dense kernels are [in, out], torch Linear weights [out, in]; our unembed is [D, V], lm_head.weight [V, D]: every
declared matrix but the embeddings is transposed. Our experts' weights are stacked [E, in, out]; HF holds expert j's
[out, in] as a tensor of its own.
"""

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from celerity_jax.errors import ConfigError
from celerity_jax.hf import fold
from celerity_jax.model import moe, transformer
from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig

CLASSES = {"llama": "LlamaForCausalLM", "gpt_neox": "GPTNeoXForCausalLM", "mixtral": "MixtralForCausalLM",
           "celerity": "CelerityForCausalLM"}
# transformers' activation names (ACT2FN) of our ungated MLPs.
HF_ACTIVATIONS = {"squared_relu": "relu2", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
# What each architecture field may hold for the export to be exact; an option added to ModelConfig later is refused
# until the export learns it.
EXPORTABLE = {"norm": ("layernorm", "rmsnorm"), "mlp": ("squared_relu", "swiglu", "gelu", "gelu_tanh"),
              "positions": ("alibi", "rope", "learned"), "router": ("hash", "topk")}
# ModelConfig fields that change no computed value of float32 inference (how it runs or trains, not what it computes).
EXECUTION_FIELDS = ("compute_dtype", "residual_dtype", "attention_impl", "dense_backward", "logits_chunk_len",
                    "scan_layers", "remat", "router_aux_coef", "expert_parallel")
# Fields the export reads (into the multipliers, the config.json or the shapes).
ARCHITECTURE_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "max_seq_len", "norm",
                       "norm_eps", "mlp", "mlp_ratio", "positions", "rope_theta", "tie_embeddings", "use_bias",
                       "parametrization", "depth_alpha", "d_base", "n_layers_base", "sigma_base", "alpha_input",
                       "alpha_output", "n_experts", "router", "experts_per_token", "capacity_factor", "expert_group_len",
                       "normalize_gates")


def architecture(cfg: ModelConfig) -> str:
    """"llama", "gpt_neox", "mixtral" or "celerity"; ConfigError for a model the export cannot reproduce exactly."""
    for name, allowed in EXPORTABLE.items():
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"ModelConfig.{name}={getattr(cfg, name)!r} has no exact Hugging Face export (it knows "
                              f"{', '.join(allowed)}); export a model with one of those")
    unknown = [f.name for f in dataclasses.fields(cfg)
               if f.name not in ARCHITECTURE_FIELDS + EXECUTION_FIELDS and getattr(cfg, f.name) != f.default]
    if unknown:
        raise ConfigError(f"ModelConfig.{unknown[0]}={getattr(cfg, unknown[0])!r} is not known to the Hugging Face "
                          "export, which would drop it; export a model that leaves it at its default")
    llama_shaped = cfg.positions == "rope" and cfg.norm == "rmsnorm" and cfg.mlp == "swiglu"
    if cfg.n_experts > 1:
        return "mixtral" if llama_shaped and not cfg.use_bias and _routes_as_mixtral(cfg) else "celerity"
    if llama_shaped:
        return "llama"
    if cfg.positions == "rope" and cfg.norm == "layernorm" and cfg.mlp != "swiglu" and cfg.kv_heads == cfg.n_heads:
        return "gpt_neox"
    return "celerity"


def can_drop(cfg: ModelConfig) -> bool:
    """Whether a mixture of experts drops routes of some sequence: whether, at some length up to max_seq_len, its
    expert capacity falls short of the positions dispatched together."""
    groups = {moe.expert_group_len(cfg, n) for n in range(1, cfg.max_seq_len + 1)}
    return any(moe.expert_capacity(cfg, g) < g for g in groups)


def _routes_as_mixtral(cfg: ModelConfig) -> bool:
    """Whether the mixture routes as Mixtral's: softmax top-k gates divided by their sum, no route ever dropped."""
    return cfg.router == "topk" and cfg.normalize_gates and not can_drop(cfg)


def hf_config(cfg: ModelConfig, arch: str, *, dtype: str, eos_id: int) -> dict:
    """config.json of the export (without the celerity_* keys)."""
    common = {"architectures": [CLASSES[arch]], "model_type": arch, "vocab_size": cfg.vocab_size,
              "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
              "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_seq_len,
              "tie_word_embeddings": False, "bos_token_id": eos_id, "eos_token_id": eos_id, "dtype": dtype,
              "use_cache": True}
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    llama_shaped = {"num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
                    "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta, "rope_parameters": rope,
                    "attention_dropout": 0.0}
    if arch == "llama":
        return {**common, **llama_shaped, "attention_bias": cfg.use_bias, "mlp_bias": cfg.use_bias,
                "pretraining_tp": 1}
    if arch == "mixtral":
        return {**common, **llama_shaped, "num_local_experts": cfg.n_experts,
                "num_experts_per_tok": cfg.experts_per_token, "sliding_window": None, "router_jitter_noise": 0.0}
    if arch == "gpt_neox":
        return {**common, "hidden_act": HF_ACTIVATIONS[cfg.mlp], "layer_norm_eps": cfg.norm_eps,
                "use_parallel_residual": False, "rotary_pct": 1.0, "rotary_emb_base": cfg.rope_theta,
                "rope_parameters": {**rope, "partial_rotary_factor": 1.0}, "attention_bias": cfg.use_bias,
                "attention_dropout": 0.0, "hidden_dropout": 0.0}
    # a dense model's config.json holds no mixture keys, as it did before the class knew mixtures
    experts = {} if cfg.n_experts == 1 else {
        "n_experts": cfg.n_experts, "router": cfg.router, "experts_per_token": cfg.experts_per_token,
        "capacity_factor": cfg.capacity_factor, "expert_group_len": cfg.expert_group_len,
        "normalize_gates": cfg.normalize_gates}
    return {**common, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "norm": cfg.norm,
            "norm_eps": cfg.norm_eps, "mlp": cfg.mlp, "positions": cfg.positions, "rope_theta": cfg.rope_theta,
            "use_bias": cfg.use_bias, **experts,
            "auto_map": {"AutoConfig": "configuration_celerity.CelerityConfig",
                         "AutoModelForCausalLM": "modeling_celerity.CelerityForCausalLM"}}


class Tensor(NamedTuple):
    """One HF tensor: our flat path, its HF name, and its width when the HF class holds it whatever the model does
    (GPT-NeoX's LayerNorm and MLP biases: zeros without use_bias), else None; `expert` j where it is expert j's part
    of our stacked leaf."""
    ours: str
    name: str
    always_width: int | None = None
    expert: int | None = None


def _names(cfg: ModelConfig, arch: str) -> list[Tensor]:
    """Every tensor but GPT-NeoX's fused q|k|v, whether or not the model holds it (biases, a top-k router)."""
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
        stock = arch in ("llama", "mixtral")
        parts = {"attn_norm": "input_layernorm" if stock else "attn_norm",
                 "mlp_norm": "post_attention_layernorm" if stock else "mlp_norm",
                 **{f"attn/{p}": f"{'self_attn' if stock else 'attn'}.{p}_proj" for p in "qkvo"}}
        if cfg.n_experts == 1:
            parts.update({f"mlp/{p}": f"mlp.{p}_proj" for p in ("up", "gate", "down")})
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
        if cfg.n_experts > 1:
            names += _expert_names(cfg, arch, f"block_{i}/mlp", layer.format(i=i))
    return names


def _expert_names(cfg: ModelConfig, arch: str, ours: str, layer: str) -> list[Tensor]:
    """A mixture's router and each expert's projections: Mixtral's (w1 gate, w3 up, w2 down; no biases) or ours."""
    if arch == "mixtral":
        moe, projections = f"{layer}block_sparse_moe.", {"gate": "w1", "up": "w3", "down": "w2"}
        names = [Tensor(f"{ours}/router", f"{moe}gate.weight")]
    else:
        moe, projections = f"{layer}mlp.", {p: f"{p}_proj" for p in ("up", "gate", "down")}
        names = [Tensor(f"{ours}/router", f"{moe}router.weight")]
    for j in range(cfg.n_experts):
        for p, theirs in projections.items():
            names += [Tensor(f"{ours}/experts/{p}/{leaf}", f"{moe}experts.{j}.{theirs}.{weight}", expert=j)
                      for leaf, weight in (("kernel", "weight"), ("bias", "bias"))]
    return names


def _transposed(cfg: ModelConfig, tensor: Tensor) -> bool:
    """Whether the HF tensor is our leaf (expert j's part of it) transposed: every declared matrix but the
    embeddings."""
    declared = fold.declarations(cfg).get(tensor.ours)
    if declared is not None and tensor.expert is not None:  # one expert's part: declared as the stack, less its axis
        declared = dataclasses.replace(declared, axes=declared.axes[1:])
    return declared is not None and declared.is_matrix and declared.role is not Role.EMBEDDING


def to_hf(cfg: ModelConfig, arch: str, folded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The HF tensors of folded flat leaves (fold.fold's)."""
    out = {}
    for tensor in _names(cfg, arch):
        if tensor.ours in folded:
            x = folded[tensor.ours] if tensor.expert is None else folded[tensor.ours][tensor.expert]
            out[tensor.name] = np.ascontiguousarray(x.T if _transposed(cfg, tensor) else x)
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
            shape = ours[tensor.ours] if tensor.expert is None else ours[tensor.ours][1:]
            shapes[tensor.name] = shape[::-1] if _transposed(cfg, tensor) else shape
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
    folded, experts = {}, {}
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
        x = x.T if _transposed(cfg, tensor) else x
        if tensor.expert is None:
            folded[tensor.ours] = x
        else:
            experts.setdefault(tensor.ours, []).append(x)  # _names lists the experts in order
    folded.update({path: np.stack(per_expert) for path, per_expert in experts.items()})
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
