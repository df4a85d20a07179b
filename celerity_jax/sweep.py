"""`celerity sweep`: a hyperparameter sweep of one model, stopped early by predicting final losses.

For every value of one swept gin binding (`--sweep 'RecipeConfig.tau=0.2,0.4,0.8'`) the sweep needs
reference normalized curves with the same collapse controls (TPP, τ, schedule; SCIENCE.md §6). It trains
them on smaller models (`--reference-model`, cheap; once per setting, since τ is a control, or once for
all settings with `--shared-references` when the swept binding leaves the controls alone, e.g. the
batch at fixed τ), or takes them as files (`--reference`, `--reference-for`). It trains the target model
of every setting, predicts each setting's final loss at every checkpoint fraction by early-align
against its references (family-aware across reference sizes) and ranks the settings. With `--stop-at F
--keep K` only the K best by the prediction at F train past F; the others keep a checkpoint at F, so a
rerun with a larger `--keep` (or without `--stop-at`) finishes them. Rerunning a command resumes it.

Workdir layout:
    sweep.json, sweep.md               the summary, rewritten after every phase
    <setting>/<size>/                  a run directory (the target and each trained reference)
    <setting>/<size>.reference.json    the reference curve of a trained or given reference run
    shared/...                         the same, once for every setting (--shared-references)
"""

import dataclasses
import json
import math
import os
import re
import time

import numpy as np

from celerity_jax.errors import ConfigError

FORMAT = "celerity-sweep/1"
REFERENCE_SUFFIX = ".reference.json"
METHODS = ("auto", "family", "nearest")


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="sweep one gin binding on a model; predict final losses early "
                                            "from smaller reference models and stop the losers")
    p.add_argument("--model", required=True, help="gin file of the swept (target) model size, e.g. "
                                                  "experiments/tiny/d80.gin")
    p.add_argument("--sweep", required=True, metavar="BINDING=V1,V2,...",
                   help="the swept binding and its values, e.g. 'RecipeConfig.tau=0.2,0.4,0.8'")
    p.add_argument("--gin_file", action="append", default=[],
                   help="gin file layered after each run's size file (every run of the sweep); repeatable")
    p.add_argument("--gin_param", action="append", default=[], help="a binding for every run; repeatable")
    p.add_argument("--reference-model", action="append", default=[], metavar="GIN",
                   help="gin file of a smaller size trained as reference (per setting); repeatable")
    p.add_argument("--shared-references", action="store_true",
                   help="train the --reference-model runs once, without the swept binding (only when it "
                        "leaves TPP, τ and schedule alone)")
    p.add_argument("--reference", default="", metavar="PATH[,PATH...]",
                   help="reference JSONs or finished CURVEs used for every setting")
    p.add_argument("--reference-for", action="append", default=[], metavar="VALUE=PATH[,PATH...]",
                   help="the references of one setting; repeatable")
    p.add_argument("--fractions", default="0.1,0.2,0.3", help="fractions of training to predict at")
    p.add_argument("--stop-at", type=float, help="train every setting to this fraction, then only the --keep best")
    p.add_argument("--keep", type=int, default=1, help="settings trained past --stop-at (also the what-if "
                                                       "decisions of the summary)")
    p.add_argument("--method", choices=METHODS, default="auto",
                   help="family: the family-aware curve of all references at the target's N; nearest: the "
                        "reference nearest in log N; auto: family when the references span sizes")
    p.add_argument("--align-start", type=float, default=0.5,
                   help="at fraction f, early-align over t̂ in [align_start·f, f]")
    p.add_argument("--workdir", required=True)
    p.add_argument("--force_new", action="store_true",
                   help="archive (inside it) a run directory that holds a different run, and start it over")
    p.add_argument("--force", action="store_true", help="accept references whose controls differ")
    p.set_defaults(func=cmd_sweep)


@dataclasses.dataclass(frozen=True)
class Setting:
    value: str    # the gin literal, e.g. "0.2"
    name: str     # its directory, e.g. "tau_0.2"
    binding: str  # "RecipeConfig.tau = 0.2"


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    workdir: str
    model: str
    param: str
    settings: tuple[Setting, ...]
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


def parse_sweep(text: str) -> tuple[str, tuple[Setting, ...]]:
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
    settings = tuple(Setting(v, name, f"{param} = {v}") for v, name in zip(values, names))
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
    return os.path.splitext(os.path.basename(gin_file))[0]


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One training run of the sweep, with what identifies it."""
    label: str          # e.g. "tau_0.2/d80"
    workdir: str
    gin_files: tuple[str, ...]
    gin_params: tuple[str, ...]
    configs: dict
    plan: object        # recipe.Plan
    identity: dict

    @property
    def controls(self):
        from celerity_jax.collapse.loading import Controls
        p = self.plan
        return Controls(n_params=p.n_params, tpp=p.tpp, tau=p.tau, schedule=p.schedule,
                        warmup_frac=p.warmup_steps / p.steps)

    def flops(self, steps: int) -> float:
        return float(steps) * self.plan.batch_tokens * self.plan.flops_per_token


def make_run(label: str, workdir: str, gin_files: tuple[str, ...], gin_params: tuple[str, ...]) -> SweepRun:
    from celerity_jax import gin_config, recipe
    from celerity_jax.train.loop import RunConfigs, run_identity

    configs = gin_config.parse_gin(gin_files, gin_params)
    plan = recipe.make_plan(configs["model"], configs["recipe"])
    return SweepRun(label, workdir, gin_files, gin_params, configs, plan, run_identity(RunConfigs(**configs), plan))


@dataclasses.dataclass(frozen=True)
class SettingRuns:
    setting: Setting
    target: SweepRun
    references: tuple[SweepRun, ...]    # trained references (possibly shared with other settings)
    given: tuple[str, ...]              # given reference paths (JSON or CURVE)
    reference_dir: str                  # where its reference JSONs go


def plan_sweep(spec: SweepSpec) -> list[SettingRuns]:
    """Parses every run's gin and checks the whole sweep before anything trains."""
    check_spec(spec)

    def run_of(directory: str, model: str, params: tuple[str, ...]) -> SweepRun:
        label = f"{directory}/{size_name(model)}"
        return make_run(label, os.path.join(spec.workdir, label), (model, *spec.gin_files), params)

    shared = tuple(run_of("shared", m, spec.gin_params) for m in spec.reference_models) \
        if spec.shared_references else ()
    out = []
    for s in spec.settings:
        params = (*spec.gin_params, s.binding)
        target = run_of(s.name, spec.model, params)
        refs = shared or tuple(run_of(s.name, m, params) for m in spec.reference_models)
        given = dict(spec.references_for).get(s.value, spec.references)
        ref_dir = os.path.join(spec.workdir, "shared" if shared else s.name)
        out.append(SettingRuns(s, target, refs, given, ref_dir))
    _check_controls(spec, out)
    for a, b in zip(out, out[1:]):
        if a.target.identity == b.target.identity:
            raise ConfigError(f"the settings {a.setting.binding!r} and {b.setting.binding!r} give the same run; "
                              "is the swept binding overridden or unused?")
    return out


def _check_controls(spec: SweepSpec, setting_runs: list[SettingRuns]) -> None:
    """Refuses, before any training, references whose TPP, τ or schedule differ from the target's."""
    from celerity_jax.collapse import loading, reference

    for sr in setting_runs:
        target = sr.target.controls
        for ref in sr.references:
            problems = ref.controls.mismatches(target)
            if problems and not spec.force:
                raise ConfigError(
                    f"{ref.label} would not be a reference for {sr.target.label}: {', '.join(problems)} "
                    "(reference vs target). A normalized curve depends on TPP, τ and the schedule: sweep a "
                    "binding that keeps them equal across sizes (RecipeConfig.tau rather than weight_decay), "
                    "drop --shared-references when the swept binding is a control, or pass --force")
        refs = [reference.load_reference(p) for p in sr.given if p.endswith(".json")]
        if refs:
            reference.check_controls(refs, target, sr.target.label, spec.force)
        for path in (p for p in sr.given if not p.endswith(".json")):
            curve = loading.load_curve(path)
            if not curve.finished:
                raise ConfigError(f"{path}: a reference run must be finished (it stops at step "
                                  f"{int(curve.step_T[-1])} of {curve.total_steps})")
            problems = curve.controls.mismatches(target)
            if problems and not spec.force:
                raise ConfigError(f"{path} would not be a reference for {sr.target.label}: {', '.join(problems)} "
                                  "(reference vs target); give a reference trained with the same TPP, τ and "
                                  "schedule, or pass --force")


def steps_done(run: SweepRun, force_new: bool) -> int:
    """Steps in the run's curve.csv (0 if none); refuses a workdir holding a different run unless
    `force_new` (then 0: the trainer archives it)."""
    from celerity_jax.collapse import loading
    from celerity_jax.train.rundir import check_workdir

    try:
        check_workdir(run.workdir, run.identity, force_new=False)
    except ConfigError:
        if force_new:
            return -1
        raise
    path = os.path.join(run.workdir, loading.CURVE_CSV)
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        if sum(1 for line in f if line.strip()) < 2:
            return 0
    return int(loading.load_curve(run.workdir).step_T[-1])


def stop_step(plan, frac: float) -> int:
    """The last step whose t̂ is at most `frac` (at least 1)."""
    return max(1, math.floor(frac * plan.steps + 1e-9))


def train_run(run: SweepRun, until_step: int, train_fn, force_new: bool, log) -> float:
    """Trains (or resumes) `run` up to `until_step` unless it is there; returns the seconds it took."""
    from celerity_jax import gin_config
    from celerity_jax.train.loop import RunConfigs

    done = steps_done(run, force_new)
    if done >= until_step:
        return 0.0
    params = run.gin_params + ((f"TrainConfig.stop_at_step = {until_step}",) if until_step < run.plan.steps else ())
    log(f"\n== {run.label}: steps {max(done, 0)} -> {until_step} of {run.plan.steps}")
    configs = gin_config.parse_gin(run.gin_files, params)
    start = time.time()
    train_fn(RunConfigs(**configs), run.workdir, operative_config=gin_config.operative_config_str(),
             force_new=done < 0)
    return time.time() - start


def reference_paths(sr: SettingRuns, monitor_cfg, force: bool) -> list[str]:
    """Reference JSONs of a setting: built from its trained (or given CURVE) references, or given."""
    from celerity_jax.collapse import loading, reference

    os.makedirs(sr.reference_dir, exist_ok=True)
    paths = []
    for run in sr.references:
        path = os.path.join(sr.reference_dir, size_name(run.workdir) + REFERENCE_SUFFIX)
        ref = reference.reference_from_curves([loading.load_curve(run.workdir)], monitor_cfg.n_bins,
                                              monitor_cfg.smooth_bins, monitor_cfg.offset, force)
        reference.save_reference(ref, path)
        paths.append(path)
    for i, given in enumerate(sr.given):
        if given.endswith(".json"):
            paths.append(given)
            continue
        path = os.path.join(sr.reference_dir, f"given-{i}{REFERENCE_SUFFIX}")
        ref = reference.reference_from_curves([loading.load_curve(given)], monitor_cfg.n_bins,
                                              monitor_cfg.smooth_bins, monitor_cfg.offset, force)
        reference.save_reference(ref, path)
        paths.append(path)
    return paths


def predict(curve, reference_G, frac: float, align_start: float, offset: float) -> dict | None:
    """Early-align of the curve's steps up to t̂ = `frac` over [align_start·frac, frac]: the predicted
    final loss and its 1σ error, or None when the curve has not reached `frac`."""
    from celerity_jax.collapse import curves

    if curve.step_T[-1] < math.floor(frac * curve.total_steps + 1e-9):
        return None
    seen_T = curve.frac_T <= frac + 1e-9
    sum_G, count_G = curves.bin_curve(curve.frac_T[seen_T], curve.loss_T[seen_T], reference_G.shape[0])
    align = curves.early_align(sum_G, count_G, reference_G, (align_start * frac, frac), offset)
    if not math.isfinite(float(align.final)):
        return None
    return {"pred": float(align.final), "err": float(align.final_err)}


def setting_predictions(sr: SettingRuns, ref_paths: list[str], spec: SweepSpec) -> dict:
    """{"method", "notes", "family"/"nearest": {fraction: prediction}} for one setting's target."""
    from celerity_jax.collapse import loading, monitor, reference

    cfg = sr.target.configs["monitor"]
    curve = loading.load_curve(sr.target.workdir)
    n_target = sr.target.plan.n_params
    sizes = {p: reference.load_reference(p).controls.n_params for p in ref_paths}
    spans = None not in sizes.values() and len(set(sizes.values())) > 1
    method = ("family" if spans else "nearest") if spec.method == "auto" else spec.method
    known = [p for p in ref_paths if sizes[p] is not None] or ref_paths
    nearest = min(known, key=lambda p: abs(math.log((sizes[p] or n_target) / n_target)))
    candidates = {"family": ref_paths, "nearest": [nearest]} if spans else {"nearest": ref_paths}
    out = {"method": method if method in candidates else "nearest", "references": ref_paths,
           "nearest_reference": nearest, "notes": []}
    for name, paths in candidates.items():
        reference_G, notes = monitor.monitor_reference(paths, cfg, curve.controls, sr.target.label, spec.force)
        out["notes"] += [n for n in notes if n not in out["notes"]]
        out[name] = {str(f): predict(curve, reference_G, f, spec.align_start, cfg.offset) for f in spec.fractions}
    return out


def true_final(run: SweepRun) -> float | None:
    """The smoothed final training loss of a finished run (what the predictions predict), else None."""
    from celerity_jax.collapse import loading, reference

    curve = loading.load_curve(run.workdir)
    if not curve.finished:
        return None
    cfg = run.configs["monitor"]
    return reference.normalize_run(curve, cfg.n_bins, cfg.smooth_bins, cfg.offset)[1]


def rank(values: dict[str, float]) -> list[str]:
    return sorted(values, key=lambda k: values[k])


def kendall_tau(order_a: list[str], order_b: list[str]) -> float:
    """Rank correlation of two orderings of the same items: 1 identical, -1 reversed."""
    pos_a = {k: i for i, k in enumerate(order_a)}
    pos_b = {k: i for i, k in enumerate(order_b)}
    items = list(pos_a)
    pairs = [(x, y) for i, x in enumerate(items) for y in items[i + 1:]]
    if not pairs:
        return math.nan
    return float(sum(np.sign(pos_a[x] - pos_a[y]) * np.sign(pos_b[x] - pos_b[y]) for x, y in pairs) / len(pairs))


def decide(predictions: dict[str, dict | None], keep: int) -> list[str] | None:
    """The `keep` settings with the lowest predicted final loss; None unless every setting has one."""
    if any(p is None for p in predictions.values()):
        return None
    return rank({k: p["pred"] for k, p in predictions.items()})[:keep]


def summarize(spec: SweepSpec, setting_runs: list[SettingRuns], predictions: dict[str, dict],
              done: dict[str, int], seconds: dict[str, float], stopped: list[str] | None) -> dict:
    """sweep.json: settings, predictions per fraction, rankings, decisions, truth, regret and compute."""
    settings, finals = [], {}
    cfg = setting_runs[0].target.configs["monitor"]
    for sr in setting_runs:
        p, name = sr.target.plan, sr.setting.name
        final = true_final(sr.target) if done[sr.target.label] >= p.steps else None
        if final is not None:
            finals[name] = final
        settings.append({
            "name": name, "value": sr.setting.value, "binding": sr.setting.binding, "label": sr.target.label,
            "target": sr.target.workdir, "seconds": seconds.get(sr.target.label, 0.0),
            "n_params": p.n_params, "tpp": p.tpp, "tau": p.tau, "weight_decay": p.weight_decay,
            "batch_seqs": p.batch_seqs, "steps": p.steps, "steps_done": done[sr.target.label],
            "status": "finished" if final is not None else "stopped",
            "final_loss": final, "method": predictions[name]["method"],
            "predictions": {m: predictions[name][m] for m in ("family", "nearest") if m in predictions[name]},
            "references": predictions[name]["references"],
            "nearest_reference": predictions[name]["nearest_reference"], "notes": predictions[name]["notes"],
            "target_flops_full": sr.target.flops(p.steps), "target_flops_done": sr.target.flops(done[sr.target.label])})
    names = [s["name"] for s in settings]
    ref_runs = {r.label: r for sr in setting_runs for r in sr.references}
    ref_flops = sum(r.flops(done[label]) for label, r in ref_runs.items())
    full_flops = {s["name"]: s["target_flops_full"] for s in settings}
    truth = rank(finals) if len(finals) == len(names) else None
    per_fraction = []
    for f in spec.fractions:
        row = {"fraction": f}
        for method in ("family", "nearest"):
            if method not in settings[0]["predictions"]:
                continue
            preds = {s["name"]: s["predictions"][method][str(f)] for s in settings}
            chosen = decide(preds, spec.keep)
            entry = {"ranking": None if chosen is None else rank({k: p["pred"] for k, p in preds.items()}),
                     "chosen": chosen}
            if chosen is not None:
                first, second = ([preds[k] for k in entry["ranking"][:2]] + [None])[:2]
                entry["separation_sigma"] = (None if second is None else (second["pred"] - first["pred"])
                                             / math.hypot(first["err"], second["err"]))
                # Compute if every setting trains to f and only the chosen ones on to the end.
                used = sum(full_flops[s["name"]] * (1.0 if s["name"] in chosen else stop_step_frac(s, f))
                           for s in settings)
                entry["target_compute_fraction"] = used / sum(full_flops.values())
                entry["total_compute_fraction"] = (used + ref_flops) / (sum(full_flops.values()) + ref_flops)
            if truth is not None and chosen is not None:
                entry["regret"] = min(finals[k] for k in chosen) - finals[truth[0]]
                entry["kendall_tau"] = kendall_tau(entry["ranking"], truth)
                entry["errors"] = {k: preds[k]["pred"] / finals[k] - 1.0 for k in names}
                entry["mean_abs_error"] = float(np.mean([abs(e) for e in entry["errors"].values()]))
            row[method] = entry
        per_fraction.append(row)
    return {
        "format": FORMAT, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "param": spec.param,
        "model": spec.model, "gin_files": list(spec.gin_files), "gin_params": list(spec.gin_params),
        "reference_models": list(spec.reference_models), "shared_references": spec.shared_references,
        "grid": {k: getattr(cfg, k) for k in ("n_bins", "smooth_bins", "offset")},
        "fractions": list(spec.fractions), "align_start": spec.align_start, "keep": spec.keep,
        "stop_at": spec.stop_at, "stopped": stopped, "settings": settings, "true_ranking": truth,
        "per_fraction": per_fraction,
        "compute": {"target_flops_done": sum(s["target_flops_done"] for s in settings),
                    "target_flops_full": sum(full_flops.values()), "reference_flops_done": ref_flops},
        "seconds": seconds, "reference_seconds": sum(seconds.get(label, 0.0) for label in ref_runs)}


def stop_step_frac(setting_row: dict, frac: float) -> float:
    """Fraction of a target's steps trained when it stops at t̂ = frac."""
    return max(1, math.floor(frac * setting_row["steps"] + 1e-9)) / setting_row["steps"]


def _loss(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def render_markdown(summary: dict) -> str:
    settings = summary["settings"]
    fracs = summary["fractions"]
    primary = settings[0]["method"]
    lines = [f"# celerity sweep: {summary['param']}", "",
             f"Target `{summary['model']}`, gin {summary['gin_files']} {summary['gin_params']}; references: "
             + (", ".join(f"`{m}`" for m in summary["reference_models"]) or "given files")
             + (" (shared by all settings)" if summary["shared_references"] else "")
             + f". Early-align over t̂ in [{summary['align_start']:g}·f, f]; ranking by the {primary} "
               f"prediction. {summary['created']}.", "",
             "| setting | τ | λ | batch | steps | trained | final loss | "
             + " | ".join(f"pred @{f:g}" for f in fracs) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(fracs)]
    for s in settings:
        preds = s["predictions"][s["method"]]
        cells = [("–" if preds[str(f)] is None else f"{preds[str(f)]['pred']:.4f} ± {preds[str(f)]['err']:.4f}")
                 for f in fracs]
        lines.append(f"| {s['name']} | {s['tau']:.3g} | {s['weight_decay']:.3g} | {s['batch_seqs']} | {s['steps']} | "
                     f"{s['steps_done']} | {_loss(s['final_loss'])} | " + " | ".join(cells) + " |")
    lines += ["", "True ranking (smoothed final training loss): "
              + (" < ".join(summary["true_ranking"]) if summary["true_ranking"] else "not every setting finished"), ""]
    lines += ["| fraction | method | predicted ranking | chosen | separation (σ) | target compute | "
              "with references | regret | Kendall τ | mean abs error |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in summary["per_fraction"]:
        for method in ("family", "nearest"):
            e = row.get(method)
            if e is None:
                continue
            if e["chosen"] is None:
                lines.append(f"| {row['fraction']:g} | {method} | not reached by every setting | | | | | | | |")
                continue
            sep = e["separation_sigma"]
            lines.append(
                f"| {row['fraction']:g} | {method} | {' < '.join(e['ranking'])} | {', '.join(e['chosen'])} | "
                f"{'–' if sep is None else f'{sep:.1f}'} | {100 * e['target_compute_fraction']:.0f}% | "
                f"{100 * e['total_compute_fraction']:.0f}% | "
                + (f"{e['regret']:.4f} | {e['kendall_tau']:.2f} | {100 * e['mean_abs_error']:.2f}% |"
                   if "regret" in e else "– | – | – |"))
    c = summary["compute"]
    lines += ["", "Compute: the share of the all-to-the-end target FLOPs that training every setting to the "
                  f"fraction and only the {summary['keep']} chosen to the end costs (\"with references\" adds the "
                  "reference runs to both). Regret: final loss of the best chosen setting minus the best final "
                  "loss. Separation: gap between the first two predictions over their combined 1σ error "
                  "(residual noise only; seed noise not included).", "",
              f"Trained so far: targets {c['target_flops_done']:.3g} of {c['target_flops_full']:.3g} FLOPs, "
              f"references {c['reference_flops_done']:.3g} FLOPs."]
    if summary["stopped"]:
        lines.append(f"Stopped at t̂ = {summary['stop_at']:g} (checkpoint kept; rerun with a larger --keep or "
                     f"without --stop-at to finish): {', '.join(summary['stopped'])}.")
    notes = sorted({n for s in settings for n in s["notes"]})
    lines += [""] + [f"Note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def run_sweep(spec: SweepSpec, train_fn=None, log=print) -> dict:
    """Trains references, then targets (to --stop-at, then the kept ones to the end), predicts, ranks,
    and writes sweep.json and sweep.md. `train_fn` defaults to the trainer (train.loop.train)."""
    from celerity_jax.fileio import write_json_atomic, write_text_atomic

    if train_fn is None:
        from celerity_jax.train.loop import train as train_fn
    setting_runs = plan_sweep(spec)
    os.makedirs(spec.workdir, exist_ok=True)
    summary_path = os.path.join(spec.workdir, "sweep.json")
    seconds = {}
    if os.path.isfile(summary_path):
        with open(summary_path) as f:
            seconds = dict(json.load(f).get("seconds", {}))

    def train(run: SweepRun, until: int) -> None:
        seconds[run.label] = seconds.get(run.label, 0.0) + train_run(run, until, train_fn, spec.force_new, log)

    trained_refs = {r.label: r for sr in setting_runs for r in sr.references}
    for run in trained_refs.values():
        train(run, run.plan.steps)
    ref_paths = {sr.setting.name: reference_paths(sr, sr.target.configs["monitor"], spec.force)
                 for sr in setting_runs}
    for sr in setting_runs:
        until = sr.target.plan.steps if spec.stop_at is None else stop_step(sr.target.plan, spec.stop_at)
        train(sr.target, until)
    predictions = {sr.setting.name: setting_predictions(sr, ref_paths[sr.setting.name], spec) for sr in setting_runs}
    stopped = None
    if spec.stop_at is not None:
        preds = {name: p[p["method"]][str(spec.stop_at)] for name, p in predictions.items()}
        kept = decide(preds, spec.keep)
        if kept is None:
            raise ConfigError(f"no prediction at t̂ = {spec.stop_at} for every setting (alignment window empty?); "
                              "lower --align-start or raise --stop-at")
        log(f"\nat t̂ = {spec.stop_at:g} the predicted best: {', '.join(kept)}; training only "
            f"{'it' if len(kept) == 1 else 'them'} to the end")
        for sr in setting_runs:
            if sr.setting.name in kept:
                train(sr.target, sr.target.plan.steps)
        stopped = [sr.setting.name for sr in setting_runs if sr.setting.name not in kept
                   and steps_done(sr.target, False) < sr.target.plan.steps]
        predictions = {sr.setting.name: setting_predictions(sr, ref_paths[sr.setting.name], spec)
                       for sr in setting_runs}
    done = {r.label: steps_done(r, False) for sr in setting_runs for r in (sr.target, *sr.references)}
    summary = summarize(spec, setting_runs, predictions, done, seconds, stopped)
    write_json_atomic(summary_path, summary)
    write_text_atomic(os.path.join(spec.workdir, "sweep.md"), render_markdown(summary))
    return summary


def cmd_sweep(args) -> int:
    from celerity_jax.train import rundir

    spec = spec_from_args(args)
    with rundir.locked(spec.workdir):
        summary = run_sweep(spec)
    print("\n" + render_markdown(summary))
    print(f"wrote {os.path.join(args.workdir, 'sweep.json')} and {os.path.join(args.workdir, 'sweep.md')}")
    return 0
