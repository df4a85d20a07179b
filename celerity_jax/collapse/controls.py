"""The controls of a normalized curve (TPP, τ, schedule; docs/science.md §1) and how they are compared.

`Controls.from_plan` builds them for a planned run; `controls_from_mapping` reads them by key from a
plan.json, a curve's sidecar JSON or a reference JSON. Two curves' controls match when TPP and τ differ by
at most CONTROL_RTOL and the schedules are equal (for "wsd" its decay fraction too); N may differ
(reference.check_controls applies this to a run and its references).
"""

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from celerity_jax.errors import ConfigError

# Relative tolerance when comparing TPP and τ of a run and a reference.
CONTROL_RTOL = 0.05
# Steps are exact int64: as floats, steps above 2**53 would round and could look equal.
MAX_STEP = np.iinfo(np.int64).max
JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


@dataclasses.dataclass(frozen=True)
class Controls:
    """What a normalized curve depends on (docs/science.md §1). None = unknown."""
    n_params: float | None = None
    tpp: float | None = None
    tau: float | None = None
    schedule: str | None = None
    warmup_frac: float | None = None
    wsd_decay_frac: float | None = None  # the schedule's shape when it is "wsd"; None for any other schedule

    def __post_init__(self):
        if self.schedule != "wsd":
            object.__setattr__(self, "wsd_decay_frac", None)

    @classmethod
    def from_plan(cls, plan) -> "Controls":
        """The controls of a run planned by `recipe.make_plan`."""
        return cls(n_params=plan.n_params, tpp=plan.tpp, tau=plan.tau, schedule=plan.schedule,
                   warmup_frac=plan.warmup_steps / plan.steps, wsd_decay_frac=plan.wsd_decay_frac)

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def mismatches(self, other: "Controls") -> list[str]:
        """Fields that collapse needs equal (TPP, τ, schedule name, wsd decay fraction) and that differ; N may
        differ."""
        out = []
        for name in ("tpp", "tau"):
            a, b = getattr(self, name), getattr(other, name)
            if a is not None and b is not None and abs(a - b) > CONTROL_RTOL * max(abs(a), abs(b)):
                out.append(f"{name} {a:.4g} vs {b:.4g}")
        if self.schedule and other.schedule and self.schedule != other.schedule:
            out.append(f"schedule {self.schedule!r} vs {other.schedule!r}")
        a, b = self.wsd_decay_frac, other.wsd_decay_frac
        if a is not None and b is not None and abs(a - b) > 1e-9:
            out.append(f"wsd_decay_frac {a:.4g} vs {b:.4g}")
        return out

    def unknown(self, other: "Controls") -> list[str]:
        """Collapse controls that cannot be compared because one side does not know them."""
        return [n for n in ("tpp", "tau", "schedule") if getattr(self, n) is None or getattr(other, n) is None]


def _number(meta: Mapping, key: str, source: str, fix: str) -> float | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{source}: {key!r} = {value!r} is not a non-negative number; {fix}")
    return float(value)


def _whole_number(meta: Mapping, key: str, source: str, fix: str) -> int | None:
    """An exact count such as the total steps (a float would round counts above 2**53)."""
    value = meta.get(key)
    if value is None:
        return None
    whole = int(value) if isinstance(value, float) and value.is_integer() else value
    if isinstance(whole, bool) or not isinstance(whole, int) or not 0 <= whole <= MAX_STEP:
        raise ConfigError(f"{source}: {key!r} = {value!r} is not a whole number >= 0; {fix}")
    return whole


def controls_from_mapping(meta: Mapping, source: str, fix: str = "fix that field") -> tuple[Controls, int | None]:
    """(Controls, total steps or None) from a plan.json / sidecar mapping, read by key; `fix` ends the
    message of a field that cannot be used.

    Keys: n_params, tpp (or tokens, giving tokens/n_params), tau, schedule (a name, or a mapping with
    "name"), warmup_frac (or warmup_steps), wsd_decay_frac (kept for a "wsd" schedule only), and total_steps
    (or steps).
    """
    if not isinstance(meta, Mapping):
        raise ConfigError(f"{source}: the controls are {JSON_TYPES.get(type(meta), type(meta).__name__)}, "
                          f"not a JSON object; {fix}")
    n_params = _number(meta, "n_params", source, fix)
    tokens = _number(meta, "tokens", source, fix)
    tpp = _number(meta, "tpp", source, fix)
    if tpp is None and tokens and n_params:
        tpp = tokens / n_params
    steps = _whole_number(meta, "total_steps", source, fix)
    steps = _whole_number(meta, "steps", source, fix) if steps is None else steps
    warmup_frac = _number(meta, "warmup_frac", source, fix)
    warmup_steps = _number(meta, "warmup_steps", source, fix)
    if warmup_frac is None and warmup_steps is not None and steps:
        warmup_frac = warmup_steps / steps
    schedule = meta.get("schedule", meta.get("schedule_name"))
    if isinstance(schedule, Mapping):
        schedule = schedule.get("name")
    if schedule is not None and not isinstance(schedule, str):
        raise ConfigError(f"{source}: 'schedule' = {schedule!r} is not a schedule name; {fix}")
    controls = Controls(n_params, tpp, _number(meta, "tau", source, fix), schedule, warmup_frac,
                        _number(meta, "wsd_decay_frac", source, fix))
    return controls, steps
