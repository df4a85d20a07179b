"""What a sweep is: one gin binding swept over values (the settings) on a target model, with references
trained on smaller models or given as files, and when to predict and stop. Parsed and checked here,
before anything trains.
"""

import dataclasses
import os
import re

from celerity_jax.errors import ConfigError

METHODS = ("auto", "family", "nearest", "shrunk")  # "auto" and predictor.METHODS, which this module does not import


@dataclasses.dataclass(frozen=True)
class SweptValue:
    """One value of the swept binding: one setting of the sweep."""
    value: str    # the gin literal, e.g. "0.2"
    name: str     # its directory, e.g. "tau_0.2"
    binding: str  # "RecipeConfig.tau = 0.2"


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    workdir: str
    model: str
    param: str
    settings: tuple[SweptValue, ...]
    gin_files: tuple[str, ...] = ()
    gin_params: tuple[str, ...] = ()
    reference_models: tuple[str, ...] = ()
    shared_references: bool = False
    references: tuple[str, ...] = ()
    references_for: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (value, paths) pairs
    fractions: tuple[float, ...] = (0.1, 0.2, 0.3)
    stop_at: float | None = None
    keep: int = 1
    method: str = "auto"
    align_start: float = 0.5
    force_new: bool = False
    force: bool = False


def parse_sweep(text: str) -> tuple[str, tuple[SweptValue, ...]]:
    """'Class.field=v1,v2,...' -> (param, settings)."""
    param, sep, values_text = text.partition("=")
    param = param.strip()
    values = [v.strip() for v in values_text.split(",") if v.strip()]
    if not sep or not re.fullmatch(r"\w+\.\w+", param) or not values:
        raise ConfigError(f"--sweep {text!r}: give 'Class.field=v1,v2,...', e.g. 'RecipeConfig.tau=0.2,0.4,0.8'")
    if len(set(values)) != len(values):
        raise ConfigError(f"--sweep {text!r}: a value is repeated; give each value once")
    field = param.split(".")[1]
    names = [f"{field}_" + re.sub(r"[^A-Za-z0-9._-]+", "_", v.strip("'\"")) for v in values]
    settings = tuple(SweptValue(v, name, f"{param} = {v}") for v, name in zip(values, names))
    if len({s.name for s in settings}) != len(settings):
        raise ConfigError(f"--sweep {text!r}: values {values} give clashing directory names")
    return param, settings


def parse_fractions(text: str) -> tuple[float, ...]:
    try:
        fractions = tuple(sorted({float(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"--fractions {text!r}: give comma-separated numbers, e.g. 0.1,0.2,0.3") from None
    if not fractions or not all(0.0 < f < 1.0 for f in fractions):
        raise ConfigError(f"--fractions {text!r}: each fraction must be in (0, 1), e.g. 0.1,0.2,0.3")
    return fractions


def spec_from_args(args) -> SweepSpec:
    """The spec of `celerity sweep`'s parsed arguments (see celerity_jax/cli/sweep.py)."""
    param, settings = parse_sweep(args.sweep)
    references_for = []
    values = {s.value for s in settings}
    for item in args.reference_for:
        value, sep, paths = item.partition("=")
        if not sep or value.strip() not in values or not paths.strip():
            raise ConfigError(f"--reference-for {item!r}: give VALUE=PATH[,PATH...] with VALUE one of "
                              f"the swept values {sorted(values)}")
        references_for.append((value.strip(), _paths(paths)))
    fractions = parse_fractions(args.fractions)
    if args.stop_at is not None:
        fractions = tuple(sorted(set(fractions) | {args.stop_at}))
    return SweepSpec(args.workdir, args.model, param, settings, tuple(args.gin_file), tuple(args.gin_param),
                     tuple(args.reference_model), args.shared_references, _paths(args.reference),
                     tuple(references_for), fractions, args.stop_at, args.keep, args.method, args.align_start,
                     args.force_new, args.force)


def _paths(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def check_spec(spec: SweepSpec) -> None:
    given = bool(spec.references or spec.references_for)
    if bool(spec.reference_models) == given:
        raise ConfigError("give the references either as sizes to train (--reference-model GIN, repeatable) "
                          "or as files (--reference / --reference-for), not both and not neither")
    if spec.shared_references and not spec.reference_models:
        raise ConfigError("--shared-references applies to trained references; add --reference-model")
    missing = [s.value for s in spec.settings if given and not spec.references and s.value not in
               dict(spec.references_for)]
    if missing:
        raise ConfigError(f"no references for the setting(s) {missing}; add --reference-for VALUE=PATHS "
                          "or --reference PATHS for every setting")
    sizes = [size_name(p) for p in (spec.model, *spec.reference_models)]
    if len(set(sizes)) != len(sizes):
        raise ConfigError(f"model gin files {sizes} share a name; each size needs its own file name")
    if spec.stop_at is not None and not 0.0 < spec.stop_at < 1.0:
        raise ConfigError(f"--stop-at {spec.stop_at}: give a fraction in (0, 1), e.g. 0.3")
    if spec.keep < 1:
        raise ConfigError(f"--keep {spec.keep}: keep at least 1 setting")
    if not 0.0 <= spec.align_start < 1.0:
        raise ConfigError(f"--align-start {spec.align_start}: give a number in [0, 1), e.g. 0.5")
    if spec.method not in METHODS:
        raise ConfigError(f"method {spec.method!r}: one of {METHODS}")


def size_name(gin_file: str) -> str:
    """A size's directory name: its gin file's name, e.g. "d80" for experiments/tiny/d80.gin."""
    return os.path.splitext(os.path.basename(gin_file))[0]
