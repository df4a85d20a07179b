"""Runs a sweep: plans every run (and checks them all before anything trains), trains references and
targets through `celerity_jax.run` (to --stop-at, then only the kept settings to the end), and predicts
each setting's final loss at every fraction by early-align against its references, by the method the spec names
or, with "auto", the one predictor.choose_method_across picks at that fraction from every setting's references
alone, one method for all settings so that their predictions are compared like with like.

Workdir layout:
    sweep.json, sweep.md               the summary (report.py), rewritten at the end of every invocation
    <setting>/<size>/                  a run directory (the target and each trained reference)
    <setting>/<size>.reference.json    the reference curve of a trained or given reference run
    shared/...                         the same, once for every setting (--shared-references)
"""

import dataclasses
import math
import os

from celerity_jax.collapse import curves, files, predictor, reference
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic, write_text_atomic
from celerity_jax.run import Run, RunSpec, load as load_run
from celerity_jax.sweep import report
from celerity_jax.sweep.spec import SweepSpec, SweptValue, check_spec, size_name

REFERENCE_SUFFIX = ".reference.json"


@dataclasses.dataclass(frozen=True)
class SettingRuns:
    setting: SweptValue
    target: Run                  # named by its label, e.g. "tau_0.2/d80"
    references: tuple[Run, ...]  # trained references (possibly shared with other settings)
    given: tuple[str, ...]       # given reference paths (JSON or CURVE)
    reference_dir: str           # where its reference JSONs go


def plan_sweep(spec: SweepSpec) -> list[SettingRuns]:
    """Parses every run's gin and checks the whole sweep before anything trains."""
    check_spec(spec)

    def run_of(directory: str, model: str, params: tuple[str, ...]) -> Run:
        label = f"{directory}/{size_name(model)}"
        return load_run(RunSpec(os.path.join(spec.workdir, label), (model, *spec.gin_files), params, name=label))

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
    for sr in setting_runs:
        target = sr.target.controls
        for ref in sr.references:
            problems = ref.controls.mismatches(target)
            if problems and not spec.force:
                raise ConfigError(
                    f"{ref.name} would not be a reference for {sr.target.name}: {', '.join(problems)} "
                    "(reference vs target). A normalized curve depends on TPP, τ and the schedule: sweep a "
                    "binding that keeps them equal across sizes (RecipeConfig.tau rather than weight_decay), "
                    "drop --shared-references when the swept binding is a control, or pass --force")
        refs = [files.load_reference(p) for p in sr.given if p.endswith(".json")]
        if refs:
            reference.check_controls(refs, target, sr.target.name, spec.force)
        for path in (p for p in sr.given if not p.endswith(".json")):
            curve = files.load_curve(path)
            if not curve.finished:
                raise ConfigError(f"{path}: a reference run must be finished (it stops at step "
                                  f"{int(curve.step_T[-1])} of {curve.total_steps})")
            problems = curve.controls.mismatches(target)
            if problems and not spec.force:
                raise ConfigError(f"{path} would not be a reference for {sr.target.name}: {', '.join(problems)} "
                                  "(reference vs target); give a reference trained with the same TPP, τ and "
                                  "schedule, or pass --force")


def stop_step(plan, frac: float) -> int:
    """The last step whose t̂ is at most `frac` (at least 1)."""
    return max(1, math.floor(frac * plan.steps + 1e-9))


def reference_paths(sr: SettingRuns, force: bool) -> list[str]:
    """Reference JSONs of a setting: built from its trained (or given CURVE) references, or given."""
    grid = sr.target.configs.monitor.grid
    os.makedirs(sr.reference_dir, exist_ok=True)

    def build(curve_path: str, path: str) -> str:
        ref = reference.reference_from_curves([files.load_curve(curve_path)], grid.n_bins, grid.smooth_bins,
                                              grid.offset, force)
        files.save_reference(ref, path)
        return path

    paths = [build(r.workdir, os.path.join(sr.reference_dir, size_name(r.workdir) + REFERENCE_SUFFIX))
             for r in sr.references]
    for i, given in enumerate(sr.given):
        paths.append(given if given.endswith(".json") else
                     build(given, os.path.join(sr.reference_dir, f"given-{i}{REFERENCE_SUFFIX}")))
    return paths


def _predict(curve, reference_G, frac: float, align_start: float, offset: float) -> dict | None:
    """The predictor's final loss from the curve up to t̂ = `frac`, aligned over [align_start·frac, frac]."""
    pred = predictor.predict(curve, reference_G, upto=frac, align_start=align_start, offset=offset)
    return None if pred is None else {"pred": pred.final, "err": pred.err}


def loss_so_far(curve, frac: float, n_bins: int, smooth_bins: int) -> float | None:
    """The smoothed training loss at t̂ = `frac` (the last bin reached, averaged over the past bins of the
    smoothing window), what a sweep keeping the lowest loss so far compares; None before `frac` is reached."""
    if curve.step_T[-1] < math.floor(frac * curve.total_steps + 1e-9):
        return None
    seen_T = curve.frac_T <= frac + 1e-9
    sum_G, count_G = curves.bin_curve(curve.frac_T[seen_T], curve.loss_T[seen_T], n_bins)
    mean_G, _ = curves.smooth(sum_G, count_G, smooth_bins)
    return float(mean_G[int(curves.last_bin(count_G))])


def _loaded(sr: SettingRuns, ref_paths: list[str], spec: SweepSpec):
    """The setting's target curve, its references checked against it, and the notes of the check."""
    grid = sr.target.configs.monitor.grid
    curve = files.load_curve(sr.target.workdir)
    refs, notes = reference.load_checked(ref_paths, grid, curve.controls, sr.target.name, spec.force, curve.loss)
    return curve, refs, notes


def sweep_predictions(setting_runs: list, ref_paths: dict[str, list[str]], spec: SweepSpec) -> dict[str, dict]:
    """Every setting's `setting_predictions`, each setting's curve and references loaded once. With "auto" every
    setting is ranked by one method at each fraction, chosen by leave-one-size-out on all the settings' references
    together (predictor.choose_method_across)."""
    loaded = {sr.setting.name: _loaded(sr, ref_paths[sr.setting.name], spec) for sr in setting_runs}
    choices = None
    if spec.method == "auto":
        grid = setting_runs[0].target.configs.monitor.grid
        families, frac_G = [refs for _, refs, _ in loaded.values()], curves.bin_centers(grid.n_bins)
        choices = {str(f): predictor.choose_method_across(families, frac_G, f, align_start=spec.align_start,
                                                          offset=grid.offset) for f in spec.fractions}
    return {sr.setting.name: setting_predictions(sr, ref_paths[sr.setting.name], spec, choices,
                                                 loaded[sr.setting.name]) for sr in setting_runs}


def setting_predictions(sr: SettingRuns, ref_paths: list[str], spec: SweepSpec, choices: dict | None = None,
                        loaded: tuple | None = None) -> dict:
    """One setting's target predicted at every fraction by every method its references allow: {method: {fraction:
    prediction}}, with "references", "nearest_reference", "notes" (what could not be checked, and references
    outside the short-run regime), "method_choice" {fraction: {"method", "reason", "scores"}} and "loss_so_far"
    {fraction: the smoothed loss there}.

    "method" names the entry that ranks the settings: the spec's method ("nearest" when the references have too
    few sizes for it), or with "auto" the entry "auto", at each fraction the prediction of the method in `choices`
    (`sweep_predictions`, one for every setting), or without them the one predictor.choose_method picks there
    from this setting's references alone. `loaded`: the setting's `_loaded`, when the caller has it."""
    grid = sr.target.configs.monitor.grid
    curve, refs, notes = loaded or _loaded(sr, ref_paths, spec)
    frac_G, n_params = curves.bin_centers(grid.n_bins), sr.target.plan.n_params
    out = {"method": spec.method, "references": ref_paths,
           "nearest_reference": reference.nearest(refs, n_params).source,
           "notes": notes + reference.regime_notes(refs), "method_choice": {},
           "loss_so_far": {str(f): loss_so_far(curve, f, grid.n_bins, grid.smooth_bins) for f in spec.fractions}}
    for method in predictor.available(refs):
        reference_G = predictor.reference_for(refs, frac_G, n_params, method)
        out[method] = {str(f): _predict(curve, reference_G, f, spec.align_start, grid.offset) for f in spec.fractions}
    for f in spec.fractions:
        choice = (choices[str(f)] if choices is not None else
                  predictor.method_for(spec.method, refs, frac_G, n_params, f, align_start=spec.align_start,
                                       offset=grid.offset))
        out["method_choice"][str(f)] = dataclasses.asdict(choice)
        if spec.method == "auto":
            out.setdefault("auto", {})[str(f)] = out[choice.method][str(f)]
    if out["method"] not in out:
        out["method"] = "nearest"
    return out


def run_sweep(spec: SweepSpec, train_fn=None, log=print) -> dict:
    """Trains references, then targets (to --stop-at, then the kept ones to the end), predicts, ranks,
    and writes sweep.json and sweep.md. `train_fn` defaults to the trainer (see `Run.train_to`)."""
    setting_runs = plan_sweep(spec)
    os.makedirs(spec.workdir, exist_ok=True)

    def train(run: Run, until: int | None = None) -> None:
        run.train_to(until, force_new=spec.force_new, log=log, train_fn=train_fn)

    references = {r.name: r for sr in setting_runs for r in sr.references}
    for run in references.values():
        train(run)
    ref_paths = {sr.setting.name: reference_paths(sr, spec.force) for sr in setting_runs}
    for sr in setting_runs:
        train(sr.target, None if spec.stop_at is None else stop_step(sr.target.plan, spec.stop_at))

    predicted, stopped = sweep_predictions(setting_runs, ref_paths, spec), None
    if spec.stop_at is not None:
        kept = report.decide({name: p[p["method"]][str(spec.stop_at)] for name, p in predicted.items()}, spec.keep)
        if kept is None:
            raise ConfigError(f"no prediction at t̂ = {spec.stop_at} for every setting (alignment window empty?); "
                              "lower --align-start or raise --stop-at")
        log(f"\nat t̂ = {spec.stop_at:g} the predicted best: {', '.join(kept)}; training only "
            f"{'it' if len(kept) == 1 else 'them'} to the end")
        for sr in setting_runs:
            if sr.setting.name in kept:
                train(sr.target)
        stopped = [sr.setting.name for sr in setting_runs if sr.setting.name not in kept and not sr.target.finished()]
        predicted = sweep_predictions(setting_runs, ref_paths, spec)
    runs = [*references.values(), *(sr.target for sr in setting_runs)]
    done = {r.name: r.steps_done() for sr in setting_runs for r in (sr.target, *sr.references)}
    summary = report.summarize(spec, setting_runs, predicted, done, {r.name: r.train_seconds() for r in runs},
                               stopped)
    write_json_atomic(os.path.join(spec.workdir, "sweep.json"), summary)
    write_text_atomic(os.path.join(spec.workdir, "sweep.md"), report.render_markdown(summary))
    return summary
