"""What makes two runs the same run: a run's identity, as its run.json and each of its checkpoints hold it."""

import dataclasses
import json

# The configs a run's identity holds (besides its plan); TrainConfig (logging, checkpoint cadence, mesh) is not one.
SECTIONS = ("model", "recipe", "data", "monitor")


def _json(value) -> dict:
    """JSON-normalized (tuples become lists), so that it compares equal to what was read back from a file."""
    return json.loads(json.dumps(value))


@dataclasses.dataclass(frozen=True)
class Identity:
    """A run's identity: its model, recipe, data and monitor configs and its plan (`record`, what run.json holds),
    and each of those configs' field defaults (`defaults`), at which a field added since an older identity was
    written counts as equal."""
    record: dict
    defaults: dict

    @classmethod
    def of(cls, configs, plan) -> "Identity":
        """The identity of a run with these configs (a RunConfigs) and this plan."""
        sections = {name: getattr(configs, name) for name in SECTIONS}
        defaults = {name: {f.name: f.default for f in dataclasses.fields(c) if f.default is not dataclasses.MISSING}
                    for name, c in sections.items()}
        return cls(_json({**{name: dataclasses.asdict(c) for name, c in sections.items()}, "plan": plan.to_dict()}),
                   _json(defaults))

    def completed(self, previous: dict) -> dict:
        """`previous` (an identity read back) with each config field it lacks that this identity holds at the
        field's default filled in."""
        out = _json(previous)
        for section, defaults in self.defaults.items():
            old, new = out.get(section), self.record.get(section)
            if isinstance(old, dict) and isinstance(new, dict):
                old.update({name: default for name, default in defaults.items()
                            if name not in old and name in new and new[name] == default})
        return out

    def same_run(self, previous: dict) -> bool:
        """Whether `previous` (run.json, a checkpoint's) is this identity's run."""
        return self.completed(previous) == self.record

    def differences(self, previous: dict) -> list[str]:
        """`key: old -> new` for every field where `previous` differs from this identity."""
        return diff(self.completed(previous), self.record)


def diff(a, b, prefix="") -> list[str]:
    """`key: old -> new` for every leaf where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} -> {b!r}"]
