"""The family planner: from a model shape and a token budget, every optimizer setting.

docs/science.md §2, §3 and §7.

τ = B/(η·λ_hidden·D) is the AdamW timescale of the hidden matrices as a fraction of training (B, D in tokens,
η the peak LR applied to hidden matrices, λ_hidden the decay coefficient they get: the raw λ under the decay
convention "per_lr", m_d·λ under "width_scaled"). The recipe pins τ (a number or the law τ = c·TPP^e) and
derives λ = B/(η·τ·D), or B/(η·m_d·τ·D) under "width_scaled"; the batch is given or follows B = c·D^e.
"""

import dataclasses
import json
from typing import Any

from celerity_jax import schedules
from celerity_jax.config_types import check_field_types
from celerity_jax.errors import ConfigError
from celerity_jax.model import completep, params
from celerity_jax.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    """Defaults are Celerity's. None for `tau` or `batch_seqs` means: use the law."""

    tpp: float = 20.0  # tokens per parameter, D = tpp·N
    tau: float | None = None
    # τ = tau_law_coef · TPP^tau_law_exponent, fitted to Celerity's bands (0.175, 0.087, 0.051).
    tau_law_coef: float = 0.78
    tau_law_exponent: float = -0.5
    # A fixed λ instead of a pinned τ (τ then follows from it): for baselines that do not pin τ.
    weight_decay: float | None = None
    # How λ reaches each role (model/completep.py): "per_lr" (our reading of the paper) decays every role at
    # its LR × λ; "width_scaled" (the PyTorch CompleteP reference) multiplies the hidden matrices' λ by m_d.
    decay_convention: str = "per_lr"
    batch_seqs: int | None = None
    # B_tokens = batch_law_coef · D^batch_law_exponent, D the token budget at batch_law_tpp (Celerity
    # used one batch per size at all bands, fitting 20·sqrt(D_20)); None: the run's own D.
    batch_law_coef: float = 20.0
    batch_law_exponent: float = 0.5
    batch_law_tpp: float | None = 20.0
    batch_multiple: int = 16  # the law's batch is rounded to a multiple of this (Celerity's are of 16)
    seq_len: int = 8192
    base_lr: float = 0.15  # peak LR of the base model; a role's LR is base_lr × its multiplier
    # Warmup = min(warmup_frac·D, warmup_tokens) tokens; None for warmup_tokens: the fraction alone.
    warmup_frac: float = 0.1
    warmup_tokens: float | None = 375e6
    schedule: str = "d2z"  # one of schedules.SCHEDULES
    wsd_decay_frac: float = 0.2
    adam_b1: float = 0.9
    adam_b2: float = 0.95
    # β2 from a half-life of Adam's second moment as a fraction of training (β2 = 0.5^(1/(h·T))), instead of
    # adam_b2: the memory then spans the same t̂ at every run length. None: adam_b2 as given (the default).
    adam_b2_half_life: float | None = None
    adam_eps: float = 1e-8  # base eps; each leaf's is this × its CompleteP eps multiplier
    grad_clip: float = 1.0  # global-norm clip; 0 turns clipping off
    bands: tuple[float, ...] = (20.0, 80.0, 234.0)  # TPP bands whose tokens and FLOPs are reported

    def __post_init__(self):
        check_field_types(self)
        positive = {
            "tpp": "e.g. 20, 80 or 234", "tau_law_coef": "e.g. 0.78",
            "batch_law_coef": "e.g. 20", "seq_len": "e.g. 8192", "base_lr": "e.g. 0.15",
            "adam_eps": "e.g. 1e-8"}
        for name, example in positive.items():
            _check(getattr(self, name) > 0, name, getattr(self, name), f"must be > 0 ({example})")
        _check(self.tau is None or self.tau > 0, "tau", self.tau,
               "must be > 0, or None to take it from the law tau_law_coef·TPP^tau_law_exponent")
        _check(self.weight_decay is None or self.weight_decay > 0, "weight_decay", self.weight_decay,
               "must be > 0, or None to derive it from tau")
        _check(self.weight_decay is None or self.tau is None, "weight_decay", self.weight_decay,
               "cannot be fixed together with RecipeConfig.tau; set one of them to None")
        _check(self.decay_convention in completep.DECAY_CONVENTIONS, "decay_convention", self.decay_convention,
               "must be 'per_lr' (every role decays at its LR × λ) or 'width_scaled' (hidden λ × m_d)")
        _check(self.batch_seqs is None or self.batch_seqs > 0, "batch_seqs", self.batch_seqs,
               "must be a positive number of sequences, or None for the batch law")
        _check(self.batch_law_tpp is None or self.batch_law_tpp > 0, "batch_law_tpp",
               self.batch_law_tpp, "must be > 0, or None to use the run's own token budget")
        _check(self.batch_multiple >= 1, "batch_multiple", self.batch_multiple, "must be >= 1")
        _check(self.warmup_tokens is None or self.warmup_tokens >= 0, "warmup_tokens",
               self.warmup_tokens, "must be >= 0, or None for warmup_frac alone")
        for name in ("adam_b1", "adam_b2"):
            _check(0 <= getattr(self, name) < 1, name, getattr(self, name), "must be in [0, 1)")
        _check(self.adam_b2_half_life is None or 0 < self.adam_b2_half_life < 1, "adam_b2_half_life",
               self.adam_b2_half_life, "must be a fraction of training in (0, 1), e.g. 0.01, or None for adam_b2")
        _check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "must be >= 0 (0 turns it off)")
        _check(len(self.bands) > 0 and all(b > 0 for b in self.bands), "bands", self.bands,
               "must be a non-empty tuple of positive TPPs, e.g. (20, 80, 234)")
        try:
            schedules.check_schedule(self.schedule, self.warmup_frac, self.wsd_decay_frac)
        except ConfigError as e:
            raise ConfigError(f"RecipeConfig.{e}") from None


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a run of the recipe needs; B and D in tokens unless `_seqs`, LRs at peak."""

    n_params: int
    tpp: float
    tokens: int  # steps × batch_tokens, the tokens actually trained
    steps: int
    batch_seqs: int
    batch_tokens: int
    seq_len: int
    warmup_steps: int
    schedule: str
    wsd_decay_frac: float
    base_lr: float
    lr_hidden: float  # peak LR of hidden matrices, the η of τ
    lr_peak: dict[str, float]  # peak LR per CompleteP role
    weight_decay: float
    tau: float  # the hidden matrices' timescale
    decay_convention: str
    weight_decay_mult: dict[str, float]  # λ multiplier per CompleteP role, 0 where the role does not decay
    tau_by_role: dict[str, float]  # B/(η_role·λ·D·its λ multiplier) for each role that decays
    adam_b1: float
    adam_b2: float
    adam_eps: float
    grad_clip: float
    flops_per_token: float
    train_flops: float
    bands: tuple[dict[str, float], ...]  # {"tpp", "tokens", "flops"} for each TPP band

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def tau_from(batch_tokens: float, lr: float, weight_decay: float, tokens: float) -> float:
    """τ = B/(η·λ·D): the AdamW timescale as a fraction of training, η·λ the peak decay per step."""
    _check_positive(batch_tokens=batch_tokens, lr=lr, weight_decay=weight_decay, tokens=tokens)
    return batch_tokens / (lr * weight_decay * tokens)


def weight_decay_for_tau(batch_tokens: float, lr: float, tau: float, tokens: float) -> float:
    """λ = B/(η·τ·D): the decay that pins the timescale to `tau`."""
    _check_positive(batch_tokens=batch_tokens, lr=lr, tau=tau, tokens=tokens)
    return batch_tokens / (lr * tau * tokens)


def tau_law(tpp: float, coef: float = 0.78, exponent: float = -0.5) -> float:
    """Optimal τ as a power law in tokens per parameter."""
    return coef * tpp**exponent


def batch_law(tokens: float, coef: float = 20.0, exponent: float = 0.5) -> float:
    """Batch size in tokens as a power law in the token budget."""
    return coef * tokens**exponent


def adam_b2_for_half_life(half_life_frac: float, steps: int) -> float:
    """β2 whose second-moment average halves its weight over `half_life_frac` of `steps` steps."""
    _check_positive(half_life_frac=half_life_frac, steps=steps)
    return 0.5 ** (1.0 / (half_life_frac * steps))


def make_plan(model_cfg: ModelConfig, recipe_cfg: RecipeConfig) -> Plan:
    """Derives N, D, T, B, warmup, per-role peak LRs, λ, each role's τ and FLOPs; ConfigError on a bad plan."""
    r = recipe_cfg
    group = model_cfg.expert_group_len
    if model_cfg.n_experts > 1 and group is not None and r.seq_len % group:
        raise ConfigError(f"RecipeConfig.seq_len = {r.seq_len} is not a multiple of ModelConfig.expert_group_len = "
                          f"{group}; choose a group length that divides seq_len")
    if r.seq_len > model_cfg.max_seq_len:
        raise ConfigError(f"RecipeConfig.seq_len = {r.seq_len} exceeds ModelConfig.max_seq_len = "
                          f"{model_cfg.max_seq_len}; lower seq_len or raise max_seq_len")
    n_params = params.count_params(model_cfg)
    budget = r.tpp * n_params

    if r.batch_seqs is not None:
        batch_seqs = r.batch_seqs
    else:
        law_tokens = budget if r.batch_law_tpp is None else r.batch_law_tpp * n_params
        per_multiple = r.seq_len * r.batch_multiple
        law_batch = batch_law(law_tokens, r.batch_law_coef, r.batch_law_exponent)
        batch_seqs = max(1, round(law_batch / per_multiple)) * r.batch_multiple
    batch_tokens = batch_seqs * r.seq_len
    if batch_tokens > budget:
        raise ConfigError(
            f"batch of {batch_tokens:,} tokens ({batch_seqs} × {r.seq_len}) exceeds the whole budget "
            f"of {budget:,.0f} tokens (tpp {r.tpp:g} × N {n_params:,}); lower RecipeConfig.batch_seqs "
            "(or the batch law) or raise RecipeConfig.tpp")
    steps = round(budget / batch_tokens)
    tokens = steps * batch_tokens

    warmup_tokens = r.warmup_frac * tokens
    if r.warmup_tokens is not None:
        warmup_tokens = min(warmup_tokens, r.warmup_tokens)
    warmup_steps = round(warmup_tokens / batch_tokens)
    try:
        schedules.check_schedule(r.schedule, warmup_steps / steps, r.wsd_decay_frac)
    except ConfigError as e:
        raise ConfigError(
            f"RecipeConfig: a warmup of {warmup_steps} steps (min(warmup_frac·D, warmup_tokens)) does "
            f"not fit {steps} training steps: {e} (RecipeConfig.warmup_frac / warmup_tokens, "
            "or a higher tpp)") from None

    rules = completep.role_rules(model_cfg)
    lr_peak = {role.value: r.base_lr * lr_mult for role, (_, lr_mult, _, _) in rules.items()}
    lr_hidden = lr_peak[completep.Role.HIDDEN.value]
    weight_decay_mult = {role.value: mult for role, mult in
                         completep.weight_decay_multipliers(model_cfg, r.decay_convention).items()}
    # Per unit of λ, the peak decay per step of each role that decays; τ is the hidden matrices'.
    decay_lr = {role: lr_peak[role] * mult for role, mult in weight_decay_mult.items() if mult > 0}
    hidden_decay_lr = decay_lr[completep.Role.HIDDEN.value]
    if r.weight_decay is not None:
        weight_decay = r.weight_decay
        tau = tau_from(batch_tokens, hidden_decay_lr, weight_decay, tokens)
    else:
        tau = r.tau if r.tau is not None else tau_law(r.tpp, r.tau_law_coef, r.tau_law_exponent)
        weight_decay = weight_decay_for_tau(batch_tokens, hidden_decay_lr, tau, tokens)
    for role, lr in decay_lr.items():
        if lr * weight_decay >= 1:
            raise ConfigError(
                f"the plan implies λ·η = {lr * weight_decay:.3g} >= 1 on {role} weights (λ = {weight_decay:.3g} × "
                f"{weight_decay_mult[role]:g} under decay_convention {r.decay_convention!r}, η = {lr_peak[role]:.3g}, "
                f"{steps} steps): decay would flip the sign of weights; raise RecipeConfig.tau or RecipeConfig.tpp, "
                "or lower RecipeConfig.batch_seqs so that training has more steps")

    fpt = params.flops_per_token(model_cfg, r.seq_len)
    bands = tuple({"tpp": float(b), "tokens": b * n_params, "flops": fpt * b * n_params}
                  for b in r.bands)
    return Plan(
        n_params=n_params, tpp=r.tpp, tokens=tokens, steps=steps, batch_seqs=batch_seqs,
        batch_tokens=batch_tokens, seq_len=r.seq_len, warmup_steps=warmup_steps,
        schedule=r.schedule, wsd_decay_frac=r.wsd_decay_frac, base_lr=r.base_lr,
        lr_hidden=lr_hidden, lr_peak=lr_peak, weight_decay=weight_decay, tau=tau,
        decay_convention=r.decay_convention, weight_decay_mult=weight_decay_mult,
        tau_by_role={role: tau_from(batch_tokens, lr, weight_decay, tokens) for role, lr in decay_lr.items()},
        adam_b1=r.adam_b1,
        adam_b2=r.adam_b2 if r.adam_b2_half_life is None else adam_b2_for_half_life(r.adam_b2_half_life, steps),
        adam_eps=r.adam_eps, grad_clip=r.grad_clip,
        flops_per_token=fpt, train_flops=fpt * tokens, bands=bands)


def _check(ok: bool, name: str, value, problem: str) -> None:
    if not ok:
        raise ConfigError(f"RecipeConfig.{name} = {value!r} {problem}")


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"{name} = {value!r} must be > 0; pass a positive {name}")
