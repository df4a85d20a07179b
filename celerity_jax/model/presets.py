"""Named model shapes: the Celerity family, the paper's section-3 family and a tiny CPU ladder."""

import dataclasses

from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig


def _celerity(d_model: int, n_heads: int, head_dim: int, n_layers: int) -> ModelConfig:
    # Every other field keeps the ModelConfig default, which is Celerity's (docs/science.md §7).
    return ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads, head_dim=head_dim)


def _section3(d_model: int, n_layers: int) -> ModelConfig:
    """GPT-2-like µP shapes (head 64, SwiGLU at 8/3·d, ALiBi, tied). The widths and depths are ours,
    Cerebras-GPT-like, chosen so that count_params lands within 1.5% of each name."""
    return ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=d_model // 64, head_dim=64,
                       vocab_size=50257, max_seq_len=2048, mlp="swiglu", mlp_ratio=8 / 3,
                       tie_embeddings=True, parametrization="mup", d_base=256, n_layers_base=24)


def _tiny(d_model: int, n_layers: int) -> ModelConfig:
    """Byte-vocabulary CPU shapes (256 bytes + end-of-text), base 32 wide and 2 deep."""
    return ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=d_model // 16, head_dim=16,
                       vocab_size=257, max_seq_len=256, d_base=32, n_layers_base=2)


PRESETS: dict[str, ModelConfig] = {
    "celerity-300m": _celerity(640, 10, 64, 13),
    "celerity-500m": _celerity(896, 14, 64, 17),
    "celerity-900m": _celerity(1152, 9, 128, 23),
    "celerity-1.8b": _celerity(1536, 12, 128, 30),
    "celerity-3.9b": _celerity(2048, 16, 128, 40),
    "s3-111m": _section3(768, 10),
    "s3-266m": _section3(1088, 15),
    "s3-610m": _section3(2048, 10),  # d_model 2048 as in the paper's τ example
    "s3-1.7b": _section3(2048, 32),
    "s3-3.3b": _section3(2560, 40),
    "tiny-d32": _tiny(32, 2),
    "tiny-d48": _tiny(48, 2),
    "tiny-d64": _tiny(64, 2),
    "tiny-d80": _tiny(80, 2),
    "tiny-d96": _tiny(96, 3),
    "tiny-d128": _tiny(128, 4),
}


def preset(name: str, **overrides) -> ModelConfig:
    """The preset `name`, with any fields replaced by `overrides` (validated again)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; use one of {', '.join(PRESETS)}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(ModelConfig)}
    if unknown:
        raise ConfigError(f"preset({name!r}): unknown ModelConfig field(s) {sorted(unknown)}; "
                          "check the spelling against ModelConfig")
    return dataclasses.replace(PRESETS[name], **overrides)
