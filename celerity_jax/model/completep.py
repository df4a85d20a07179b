"""The single home of the µP / CompleteP rules (docs/science.md §4; Dey et al. 2025, arXiv 2505.01618).

m_d = d_model / d_base and m_L = n_layers / n_layers_base; α = depth_alpha (1 is CompleteP).
`standard` uses m_d = m_L = 1 and 1/sqrt(head_dim) scores; `mup` uses m_L = 1; `completep` uses both.

| role         | init std        | LR multiplier        | Adam-eps multiplier | decay |
|--------------|-----------------|----------------------|---------------------|-------|
| EMBEDDING    | σ_base          | 1                    | 1/m_d               | yes   |
| HIDDEN       | σ_base/sqrt(m_d)| m_L^(α−1)/m_d        | 1/(m_d·m_L^α)       | yes   |
| BLOCK_VECTOR | const (1 or 0)  | m_L^(α−1)            | 1/(m_d·m_L^α)       | no    |
| FINAL_NORM   | const (1 or 0)  | 1                    | 1/m_d               | no    |
| UNEMBEDDING  | σ_base          | 1                    | 1/m_d               | yes   |
| ROUTER       | σ_base/m_d      | m_L^(α−1)/m_d        | 1/(m_d·m_L^α)       | yes   |
ROUTER, a top-k mixture of experts' D×E router (and only in such a model's rules), is a matrix inside a block with
a fixed number of outputs: a hidden matrix's LR, eps and decay, but µP's readout init (variance ∝ 1/fan_in², not
1/fan_in). With the hidden init, the gradient it sends back into the residual stream from its E logits would grow
as sqrt(m_d) against the other branches'.
Forward: embedding output × α_input, residual branch × m_L^(−α), logits × α_output/m_d,
scores × 1/head_dim.

WEIGHT-DECAY CONVENTION (binding for the optimizer): on a leaf with decay=True the update is
θ ← θ − η_base·s_t·lr·(adam_direction + c·λ·θ), c the role's λ multiplier (`weight_decay_multipliers`),
so the decay rate actually applied is the LR multiplier times c·λ. `RecipeConfig.decay_convention` picks c:
- "per_lr" (the default, our reading of the paper): c = 1, so hidden matrices decay at
  η_base·s_t·λ·m_L^(α−1)/m_d and the embedding and unembedding at η_base·s_t·λ, m_d/m_L^(α−1) times
  faster;
- "width_scaled" (the PyTorch CompleteP reference): c = m_d on hidden matrices (and the router), 1 elsewhere, so
  hidden matrices decay at η_base·s_t·λ·m_L^(α−1) and the embedding and unembedding at η_base·s_t·λ.
Either way τ is the hidden matrices' timescale, computed from the rate they really get (recipe.py).
"""

import dataclasses
import enum
import math
from typing import Any

import jax

from celerity_jax.model.config import ModelConfig


class Role(enum.Enum):
    EMBEDDING = "embedding"  # token embedding, learned positions, tied unembedding
    HIDDEN = "hidden"  # every matrix inside a block
    BLOCK_VECTOR = "block_vector"  # norm gains and biases inside blocks
    FINAL_NORM = "final_norm"
    UNEMBEDDING = "unembedding"  # untied output matrix
    ROUTER = "router"  # a top-k mixture of experts' router: d_model in, one logit per expert out


@dataclasses.dataclass(frozen=True)
class Multipliers:
    """Pytrees mirroring params. role is each leaf's Role; init_std is 0.0 on constant-initialized leaves (gains 1,
    biases 0); lr and eps multiply the base LR and base Adam eps; decay says whether weight decay applies."""

    role: Any
    init_std: Any
    lr: Any
    eps: Any
    decay: Any


def width_depth_mult(cfg: ModelConfig) -> tuple[float, float]:
    """(m_d, m_L) as the parametrization uses them."""
    m_d = cfg.d_model / cfg.d_base if cfg.parametrization != "standard" else 1.0
    m_l = cfg.n_layers / cfg.n_layers_base if cfg.parametrization == "completep" else 1.0
    return m_d, m_l


DECAY_CONVENTIONS = ("per_lr", "width_scaled")


def role_rules(cfg: ModelConfig) -> dict[Role, tuple[float, float, float, bool]]:
    """(init std, LR multiplier, eps multiplier, decay) for each role of the model (ROUTER in a top-k mixture of
    experts only)."""
    m_d, m_l = width_depth_mult(cfg)
    a, s = cfg.depth_alpha, cfg.sigma_base
    in_block_eps = 1.0 / (m_d * m_l**a)
    rules = {
        Role.EMBEDDING: (s, 1.0, 1.0 / m_d, True),
        Role.HIDDEN: (s / math.sqrt(m_d), m_l ** (a - 1.0) / m_d, in_block_eps, True),
        Role.BLOCK_VECTOR: (0.0, m_l ** (a - 1.0), in_block_eps, False),
        Role.FINAL_NORM: (0.0, 1.0, 1.0 / m_d, False),
        Role.UNEMBEDDING: (s, 1.0, 1.0 / m_d, True),
    }
    if cfg.n_experts > 1 and cfg.router == "topk":
        rules[Role.ROUTER] = (s / m_d, m_l ** (a - 1.0) / m_d, in_block_eps, True)
    return rules


def weight_decay_multipliers(cfg: ModelConfig, convention: str) -> dict[Role, float]:
    """The factor on λ for each role under `convention` (one of DECAY_CONVENTIONS); 0 where nothing decays."""
    m_d, _ = width_depth_mult(cfg)
    hidden = {"per_lr": 1.0, "width_scaled": m_d}[convention]
    return {role: (hidden if role in (Role.HIDDEN, Role.ROUTER) else 1.0) if decays else 0.0
            for role, (_, _, _, decays) in role_rules(cfg).items()}


def multipliers(cfg: ModelConfig, declared) -> Multipliers:
    """Per-leaf init std, LR, eps multipliers and decay flags of the parameters whose declarations (each with a
    `role`) are the leaves of `declared` (`transformer.declarations`)."""
    rules = role_rules(cfg)
    pick = lambda i: jax.tree.map(lambda d: rules[d.role][i], declared)
    return Multipliers(role=jax.tree.map(lambda d: d.role, declared), init_std=pick(0), lr=pick(1), eps=pick(2),
                       decay=pick(3))


def forward_multipliers(cfg: ModelConfig) -> dict[str, float]:
    """input (embedding output), residual (each branch), output (logits), attention (score scale)."""
    m_d, m_l = width_depth_mult(cfg)
    return {
        "input": cfg.alpha_input,
        "residual": m_l ** (-cfg.depth_alpha),
        "output": cfg.alpha_output / m_d,
        "attention": 1.0 / cfg.head_dim if cfg.parametrization != "standard" else cfg.head_dim**-0.5,
    }
