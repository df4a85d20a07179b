"""CelerityConfig: the transformers config of an exported Celerity model (shipped beside its weights, loaded with
trust_remote_code=True). The CompleteP multipliers are already folded into the weights, so these fields describe a
plain pre-norm decoder; the run's own ModelConfig rides along in config.json as `celerity_model`."""

from transformers import PretrainedConfig


class CelerityConfig(PretrainedConfig):
    model_type = "celerity"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 257
    hidden_size: int = 640
    num_hidden_layers: int = 13
    num_attention_heads: int = 10
    num_key_value_heads: int | None = None  # None: num_attention_heads (no grouping)
    head_dim: int = 64
    intermediate_size: int = 5120
    max_position_embeddings: int = 8192
    norm: str = "layernorm"  # "layernorm" or "rmsnorm"
    norm_eps: float = 1e-5
    mlp: str = "squared_relu"  # "squared_relu", "swiglu", "gelu" or "gelu_tanh"
    positions: str = "alibi"  # "alibi", "rope" or "learned"
    rope_theta: float = 10000.0
    use_bias: bool = False
    tie_word_embeddings: bool = False
    # A mixture of experts (celerity_jax's ModelConfig fields of these names); n_experts 1: the dense MLP.
    n_experts: int = 1
    router: str = "topk"  # "hash" or "topk"
    experts_per_token: int = 1
    capacity_factor: float | None = None  # None: no route is dropped
    expert_group_len: int | None = None  # positions dispatched together; None: the whole sequence
    normalize_gates: bool = False
