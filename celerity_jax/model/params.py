"""Analytic parameter count and training FLOPs per token (nothing is allocated)."""

from celerity_jax.model.config import ModelConfig


def count_params(cfg: ModelConfig) -> int:
    """Number of parameters N, embeddings included (as `init_params` would create them)."""
    d, f, inner = cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.head_dim
    norm = d * (2 if cfg.norm == "layernorm" and cfg.use_bias else 1)
    attn = 4 * d * inner + (3 * inner + d if cfg.use_bias else 0)
    n_in = 2 if cfg.mlp == "swiglu" else 1  # SwiGLU has a gate and an up projection
    mlp = (n_in + 1) * d * f + (n_in * f + d if cfg.use_bias else 0)
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    positions = cfg.max_seq_len * d if cfg.positions == "learned" else 0
    return cfg.n_layers * (2 * norm + attn + mlp) + norm + embed + positions


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6N plus attention scores, counting the full L×L matrix
    (12·layers·heads·head_dim·seq_len, as PaLM's appendix B does)."""
    return 6.0 * count_params(cfg) + 12.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len
