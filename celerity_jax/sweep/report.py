"""The sweep's summary (sweep.json) and sweep.md: settings, predictions per fraction, rankings, the
decisions they lead to, and (once every setting finished) the truth, regret and compute.

Each setting holds its predictions by every method its references allow, "method" (the entry that ranks; "auto"
is each fraction's chosen method), "method_choice" (per fraction: the method, the reason, the scores) and
"loss_so_far"; notes include the references outside the short-run regime. Each fraction's decisions are those
of every prediction method and of "current_best", the lowest loss so far (the baseline without a prediction).
"""

import dataclasses
import math
import time

import numpy as np

from celerity_jax import markdown
from celerity_jax.collapse import curves, files
from celerity_jax.run import Run

FORMAT = "celerity-sweep/1"
PREDICTION_METHODS = ("auto", "family", "nearest", "shrunk")
CURRENT_BEST = "current_best"  # the baseline decision: the lowest smoothed loss so far, no prediction


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


def flops(run: Run, steps: int) -> float:
    return float(steps) * run.plan.batch_tokens * run.plan.flops_per_token


def true_final(run: Run) -> float | None:
    """The smoothed final training loss of a finished run (what the predictions predict), else None."""
    curve = files.load_curve(run.workdir)
    if not curve.finished:
        return None
    grid = run.configs.monitor.grid
    return curves.normalize_run(curve, grid.n_bins, grid.smooth_bins, grid.offset)[1]


def stop_step_frac(setting_row: dict, frac: float) -> float:
    """Fraction of a target's steps trained when it stops at t̂ = frac."""
    return max(1, math.floor(frac * setting_row["steps"] + 1e-9)) / setting_row["steps"]


def summarize(spec, setting_runs: list, predictions: dict[str, dict], done: dict[str, int],
              seconds: dict[str, float], stopped: list[str] | None) -> dict:
    """sweep.json from the SweepSpec, the runner's SettingRuns, each setting's predictions and each run's
    steps done and training seconds (by run name), and the settings stopped early."""
    settings, finals = [], {}
    grid = setting_runs[0].target.configs.monitor.grid
    for sr in setting_runs:
        target, p, name = sr.target, sr.target.plan, sr.setting.name
        final = true_final(target) if done[target.name] >= p.steps else None
        if final is not None:
            finals[name] = final
        settings.append({
            "name": name, "value": sr.setting.value, "binding": sr.setting.binding, "label": target.name,
            "target": target.workdir, "seconds": seconds.get(target.name, 0.0),
            "n_params": p.n_params, "tpp": p.tpp, "tau": p.tau, "weight_decay": p.weight_decay,
            "batch_seqs": p.batch_seqs, "steps": p.steps, "steps_done": done[target.name],
            "status": "finished" if final is not None else "stopped",
            "final_loss": final, "method": predictions[name]["method"],
            "method_choice": predictions[name]["method_choice"],
            "predictions": {m: predictions[name][m] for m in PREDICTION_METHODS if m in predictions[name]},
            "references": predictions[name]["references"],
            "nearest_reference": predictions[name]["nearest_reference"], "notes": predictions[name]["notes"],
            "loss_so_far": predictions[name]["loss_so_far"],
            "target_flops_full": flops(target, p.steps), "target_flops_done": flops(target, done[target.name])})
    names = [s["name"] for s in settings]
    ref_runs = {r.name: r for sr in setting_runs for r in sr.references}
    ref_flops = sum(flops(r, done[label]) for label, r in ref_runs.items())
    full_flops = {s["name"]: s["target_flops_full"] for s in settings}
    truth = rank(finals) if len(finals) == len(names) else None

    def compute_fraction(chosen: list[str], f: float) -> tuple[float, float]:
        """Target and total compute if every setting trains to f and only the chosen ones on to the end."""
        used = sum(full_flops[s["name"]] * (1.0 if s["name"] in chosen else stop_step_frac(s, f)) for s in settings)
        return used / sum(full_flops.values()), (used + ref_flops) / (sum(full_flops.values()) + ref_flops)

    per_fraction = []
    for f in spec.fractions:
        row = {"fraction": f}
        for method in PREDICTION_METHODS:
            if any(method not in s["predictions"] for s in settings):
                continue
            preds = {s["name"]: s["predictions"][method][str(f)] for s in settings}
            chosen = decide(preds, spec.keep)
            entry = {"ranking": None if chosen is None else rank({k: p["pred"] for k, p in preds.items()}),
                     "chosen": chosen}
            if chosen is not None:
                first, second = ([preds[k] for k in entry["ranking"][:2]] + [None])[:2]
                entry["separation_sigma"] = (None if second is None else (second["pred"] - first["pred"])
                                             / math.hypot(first["err"], second["err"]))
                entry["target_compute_fraction"], entry["total_compute_fraction"] = compute_fraction(chosen, f)
            if truth is not None and chosen is not None:
                entry["regret"] = min(finals[k] for k in chosen) - finals[truth[0]]
                entry["kendall_tau"] = kendall_tau(entry["ranking"], truth)
                entry["errors"] = {k: preds[k]["pred"] / finals[k] - 1.0 for k in names}
                entry["mean_abs_error"] = float(np.mean([abs(e) for e in entry["errors"].values()]))
            row[method] = entry
        so_far = {s["name"]: s["loss_so_far"][str(f)] for s in settings}
        if all(x is not None for x in so_far.values()):
            ranking = rank(so_far)
            entry = {"ranking": ranking, "chosen": ranking[:spec.keep]}
            entry["target_compute_fraction"], entry["total_compute_fraction"] = compute_fraction(entry["chosen"], f)
            if truth is not None:
                entry["regret"] = min(finals[k] for k in entry["chosen"]) - finals[truth[0]]
                entry["kendall_tau"] = kendall_tau(ranking, truth)
            row[CURRENT_BEST] = entry
        per_fraction.append(row)
    return {
        "format": FORMAT, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "param": spec.param,
        "model": spec.model, "gin_files": list(spec.gin_files), "gin_params": list(spec.gin_params),
        "reference_models": list(spec.reference_models), "shared_references": spec.shared_references,
        "grid": dataclasses.asdict(grid),
        "fractions": list(spec.fractions), "align_start": spec.align_start, "keep": spec.keep,
        "stop_at": spec.stop_at, "stopped": stopped, "settings": settings, "true_ranking": truth,
        "per_fraction": per_fraction,
        "compute": {"target_flops_done": sum(s["target_flops_done"] for s in settings),
                    "target_flops_full": sum(full_flops.values()), "reference_flops_done": ref_flops},
        "seconds": seconds, "reference_seconds": sum(seconds.get(label, 0.0) for label in ref_runs)}


def _loss(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def _prediction(p: dict | None) -> str:
    return "–" if p is None else f"{p['pred']:.4f} ± {p['err']:.4f}"


def _method_label(method: str, settings: list[dict], fraction: float) -> str:
    """A decision row's method; "auto" with the methods it chose at the fraction, e.g. "auto (family)"."""
    if method == CURRENT_BEST:
        return "current best (lowest loss so far)"
    if method != "auto":
        return method
    chosen = dict.fromkeys(s["method_choice"][str(fraction)]["method"] for s in settings)
    return f"auto ({', '.join(chosen)})"


def _ranking_prediction(setting: dict, fraction: float) -> str:
    """A setting's ranking prediction at a fraction, with the method chosen there under "auto"."""
    text = _prediction(setting["predictions"][setting["method"]][str(fraction)])
    if setting["method"] != "auto":
        return text
    return f"{text} ({setting['method_choice'][str(fraction)]['method']})"


def _decision_row(fraction: float, method: str, e: dict) -> list:
    if e["chosen"] is None:
        return [f"{fraction:g}", method, "not reached by every setting"] + [""] * 7
    sep = e.get("separation_sigma")
    error = f"{100 * e['mean_abs_error']:.2f}%" if "mean_abs_error" in e else "–"  # the current best predicts none
    truth = [f"{e['regret']:.4f}", f"{e['kendall_tau']:.2f}", error] if "regret" in e else ["–"] * 3
    return [f"{fraction:g}", method, " < ".join(e["ranking"]), ", ".join(e["chosen"]),
            "–" if sep is None else f"{sep:.1f}", f"{100 * e['target_compute_fraction']:.0f}%",
            f"{100 * e['total_compute_fraction']:.0f}%", *truth]


def render_markdown(summary: dict) -> str:
    settings = summary["settings"]
    fracs = summary["fractions"]
    primary = settings[0]["method"]
    lines = [f"# celerity sweep: {summary['param']}", "",
             f"Target `{summary['model']}`, gin {summary['gin_files']} {summary['gin_params']}; references: "
             + (", ".join(f"`{m}`" for m in summary["reference_models"]) or "given files")
             + (" (shared by all settings)" if summary["shared_references"] else "")
             + f". Early-align over t̂ in [{summary['align_start']:g}·f, f]; ranking by the "
             + ("prediction of the method chosen at each fraction (in brackets)" if primary == "auto" else
                f"{primary} prediction") + f". {summary['created']}.", ""]
    lines += markdown.table(
        ["setting", "τ", "λ", "batch", "steps", "trained", "final loss", *(f"pred @{f:g}" for f in fracs)],
        ([s["name"], f"{s['tau']:.3g}", f"{s['weight_decay']:.3g}", s["batch_seqs"], s["steps"], s["steps_done"],
          _loss(s["final_loss"]), *(_ranking_prediction(s, f) for f in fracs)]
         for s in settings))
    lines += ["", "True ranking (smoothed final training loss): "
              + (" < ".join(summary["true_ranking"]) if summary["true_ranking"] else "not every setting finished"), ""]
    lines += markdown.table(
        ["fraction", "method", "predicted ranking", "chosen", "separation (σ)", "target compute", "with references",
         "regret", "Kendall τ", "mean abs error"],
        (_decision_row(row["fraction"], _method_label(method, settings, row["fraction"]), row[method])
         for row in summary["per_fraction"] for method in (*PREDICTION_METHODS, CURRENT_BEST)
         if row.get(method) is not None))
    c = summary["compute"]
    lines += ["", "Compute: the share of the all-to-the-end target FLOPs that training every setting to the "
                  f"fraction and only the {summary['keep']} chosen to the end costs (\"with references\" adds the "
                  "reference runs to both). Regret: final loss of the best chosen setting minus the best final "
                  "loss. Current best: the settings with the lowest smoothed training loss at the fraction, "
                  "chosen without a prediction. Separation: gap between the first two predictions over their "
                  "combined 1σ error (residual noise only; seed noise not included).", "",
              f"Trained so far: targets {c['target_flops_done']:.3g} of {c['target_flops_full']:.3g} FLOPs, "
              f"references {c['reference_flops_done']:.3g} FLOPs."]
    if summary["stopped"]:
        lines.append(f"Stopped at t̂ = {summary['stop_at']:g} (checkpoint kept; rerun with a larger --keep or "
                     f"without --stop-at to finish): {', '.join(summary['stopped'])}.")
    lines += ["", "Prediction method at each fraction, and why:", ""]
    for f in settings[0]["method_choice"] if settings else ():
        reasons = {s["name"]: s["method_choice"][f]["reason"] for s in settings}
        if len(set(reasons.values())) == 1:  # one choice for every setting (--method auto, or a named method)
            lines.append(f"- @{f}, every setting: {reasons[settings[0]['name']]}")
        else:
            lines += [f"- @{f}, {name}: {reason}" for name, reason in reasons.items()]
    notes = sorted({n for s in settings for n in s["notes"]})
    lines += [""] + [f"Note: {n}" for n in notes]
    return "\n".join(lines) + "\n"
