"""What each parameter is, declared where transformer.py creates it; the analytic parameter count and FLOPs.

A declaration says a parameter's CompleteP role (`completep.Role`), the logical axis of each of its dims (which
`sharding.LOGICAL_RULES` maps to mesh axes) and the forward multiplier that a Hugging Face export folds into it
(`hf/fold.py`). Sharding, the CompleteP multipliers, the optimizer and the export read the declarations
(`transformer.declarations`); nothing decides what a parameter is from its name.
"""

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
from flax import struct

from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig

LAYERS = "layers"  # the logical axis that scanned layers stack their parameters on
EXPERT = "expert"  # the logical axis that a mixture of experts stacks its experts' parameters on
FOLDS = ("input", "query", "residual", "output")
UNIT_NORMAL = nn.initializers.normal(1.0)  # every matrix's draw, rescaled per role by transformer.init_params


@dataclasses.dataclass(frozen=True)
class Declaration:
    """role: its CompleteP role; axes: the logical axis of each dim (LAYERS first when the layers are scanned);
    fold: the forward multiplier an export folds into it (one of FOLDS), None where none does."""

    role: Role
    axes: tuple[str, ...]
    fold: str | None = None

    @property
    def is_matrix(self) -> bool:
        return len([a for a in self.axes if a != LAYERS]) == 2


@struct.dataclass
class Declared(nn.meta.AxisMetadata):
    """A parameter's value with its declaration, as flax holds it while the model is initialized."""

    value: Any
    declaration: Declaration = struct.field(pytree_node=False)

    def unbox(self):
        return self.value

    def replace_boxed(self, val):
        return self.replace(value=val)

    def add_axis(self, index: int, params: dict) -> "Declared":
        """The axis a flax lift (nn.scan, nn.vmap) stacks on: its metadata's partition name, LAYERS without one."""
        axes, added = self.declaration.axes, params.get(nn.PARTITION_NAME, LAYERS)
        return self.replace(declaration=dataclasses.replace(
            self.declaration, axes=axes[:index] + (added,) + axes[index:]))

    def remove_axis(self, index: int, params: dict) -> "Declared":
        axes = self.declaration.axes
        return self.replace(declaration=dataclasses.replace(self.declaration, axes=axes[:index] + axes[index + 1:]))


def declare(init: Callable, role: Role, axes: tuple[str, ...], fold: str | None = None) -> Callable:
    """The flax initializer `init`, its result declared (role, logical axes, fold)."""
    if fold not in FOLDS + (None,):
        raise ValueError(f"fold {fold!r} is none of {FOLDS}; declare one of them, or None")
    declaration = Declaration(role, axes, fold)
    return lambda *args: Declared(init(*args), declaration)


def declarations_of(boxed) -> Any:
    """The tree of Declarations of flax's boxed parameters (`Transformer.init`'s, or their shapes)."""
    return jax.tree.map(lambda b: b.declaration, boxed, is_leaf=lambda x: isinstance(x, Declared))


def count_params(cfg: ModelConfig) -> int:
    """Number of parameters N, embeddings and every expert included (as `init_params` would create them)."""
    return _count(cfg, cfg.n_experts)


def count_active_params(cfg: ModelConfig) -> int:
    """The parameters one token's forward pass uses: N with experts_per_token experts per block instead of all
    (N itself for a dense model)."""
    return _count(cfg, cfg.experts_per_token if cfg.n_experts > 1 else 1)


def _count(cfg: ModelConfig, experts: int) -> int:
    """N with `experts` MLPs per block."""
    d, f = cfg.d_model, cfg.d_ff
    q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    norm = d * (2 if cfg.norm == "layernorm" and cfg.use_bias else 1)
    attn = 2 * d * q_width + 2 * d * kv_width + (q_width + 2 * kv_width + d if cfg.use_bias else 0)
    n_in = 2 if cfg.mlp == "swiglu" else 1  # SwiGLU has a gate and an up projection
    mlp = (n_in + 1) * d * f + (n_in * f + d if cfg.use_bias else 0)
    router = d * cfg.n_experts if cfg.n_experts > 1 and cfg.router == "topk" else 0
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    positions = cfg.max_seq_len * d if cfg.positions == "learned" else 0
    return cfg.n_layers * (2 * norm + attn + experts * mlp + router) + norm + embed + positions


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 × the active parameters (`count_active_params`) plus attention scores, counting
    the full L×L matrix (12·layers·heads·head_dim·seq_len, as PaLM's appendix B does; grouped keys and values
    change N, not this). A mixture of experts' dispatch and combine einsums are not counted."""
    return 6.0 * count_active_params(cfg) + 12.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len
