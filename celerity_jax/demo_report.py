"""The demo's measures, figure and report: each panel of `demo.py` against seed noise.

Every curve is a run's eval loss on the demo's fixed held-out batches, binned on GRID_BINS bins of t̂ and divided
by its last bin (the normalized curve ℓ(t̂)); every number is a mean over t̂ in [0.2, 1]. σ(t̂) is the standard
deviation across seeds of one setting (the root mean of the variances where several settings have seeds).

- separation of two curves a, b: mean |ℓ_a − ℓ_b| / mean σ;
- Δ/σ of a group of settings (Qiu et al.'s supercollapse test): the spread across settings of the seed-mean
  curves against σ;
- a family's dependence on size (`curves.family_measures`): the trend of ℓ̄ against ln N in seed standard errors,
  Δ/σ beside its floor, and the paper's MAE of each size against the family mean.

report.json's keys are documented in experiments/demo/README.md; other tools read them.
"""

import json
import os
import platform
import time

import numpy as np

from celerity_jax import markdown
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import save_figure_atomic, write_json_atomic, write_text_atomic

RECIPES = ("tau", "naive")  # the family's two recipes, the groups of its runs

GRID_BINS = 25  # eval.gin's 50 points give two per bin
TARGET_DELTA_OVER_SIGMA = 1.5  # equal-τ settings, and the τ family's sizes, agree within seed noise
TARGET_SEPARATION = 3.0  # off-τ and off-TPP curves sit this many σ away
TARGET_TREND = 2.0  # the τ family's slope of ℓ̄ against ln N, in its seed standard errors
TARGET_FLOOR_MULTIPLE = 1.5  # the τ family's Δ/σ against the floor a family with no size effect shows


def normalized_curves(workdir: str, runs: list) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, float]]:
    """(t̂ of the grid, each run's normalized eval curve by name, each run's last eval loss by name)."""
    from celerity_jax.collapse import curves, files

    loaded = {r.name: files.load_curve(r.workdir(workdir), loss="eval") for r in runs}
    normalized = {name: curves.normalize_run(curve, GRID_BINS, 1)[0] for name, curve in loaded.items()}
    return curves.bin_centers(GRID_BINS), normalized, {name: float(c.loss_T[-1]) for name, c in loaded.items()}


def quality_range(frac_G: np.ndarray) -> np.ndarray:
    from celerity_jax.collapse import compare

    return (frac_G >= compare.QUALITY_RANGE[0]) & (frac_G <= compare.QUALITY_RANGE[1])


def seed_sigma(groups: list[np.ndarray]) -> np.ndarray:
    """σ(t̂): root mean over the groups with several seeds (each R×G) of their across-seed variance."""
    variances = [g.var(axis=0, ddof=1) for g in groups if len(g) > 1]
    if not variances:
        raise ConfigError("no setting has a second seed, so there is no seed noise to measure against")
    return np.sqrt(np.mean(variances, axis=0))


def separation(a_G: np.ndarray, b_G: np.ndarray, sigma_G: np.ndarray, keep_G: np.ndarray) -> float:
    return float(np.abs(a_G - b_G)[keep_G].mean() / sigma_G[keep_G].mean())


def delta_over_sigma(groups: list[np.ndarray], keep_G: np.ndarray) -> dict[str, float]:
    """Spread across settings of their seed-mean curves (Δ) against σ; each group R×G."""
    sigma_G = seed_sigma(groups)
    delta_G = np.std([g.mean(axis=0) for g in groups], axis=0)
    delta, sigma = float(delta_G[keep_G].mean()), float(sigma_G[keep_G].mean())
    return {"delta": delta, "sigma": sigma, "delta_over_sigma": delta / sigma}


def _group(curves: dict[str, np.ndarray], runs: list, group: str, label: str) -> np.ndarray:
    return np.stack([curves[r.name] for r in runs if r.group == group and r.label == label])


def timescale_panel(curves: dict, runs: list, keep_G: np.ndarray) -> dict:
    """Panel 1: the equal-τ settings (the τ run with its seeds, and each setting with τ × 1) against σ, and each
    off-τ setting's separation from their mean."""
    settings = [r for r in runs if r.group == "timescale" and r.label != "base"]
    equal = [_group(curves, runs, "timescale", "base")] + [
        _group(curves, runs, "timescale", r.label) for r in settings if r.tau_factor == 1]
    out = {"equal": [r.label for r in settings if r.tau_factor == 1], **delta_over_sigma(equal, keep_G)}
    sigma_G = seed_sigma(equal)
    mean_G = np.mean([g.mean(axis=0) for g in equal], axis=0)
    out["off"] = {r.label: separation(curves[r.name], mean_G, sigma_G, keep_G) for r in settings if r.tau_factor != 1}
    out["met"] = (out["delta_over_sigma"] <= TARGET_DELTA_OVER_SIGMA
                  and min(out["off"].values()) >= TARGET_SEPARATION)
    return out


def tpp_panel(curves: dict, runs: list, keep_G: np.ndarray) -> dict:
    """Panel 2: separations of the half-TPP, base and double-TPP curves, in order, against the base's σ."""
    base_RxG = _group(curves, runs, "timescale", "base")
    sigma_G = seed_sigma([base_RxG])
    ordered = [("tpp-half", _group(curves, runs, "tpp", "tpp-half")[0]), ("base", base_RxG.mean(axis=0)),
               ("tpp-x2", _group(curves, runs, "tpp", "tpp-x2")[0])]
    pairs = {f"{a}|{b}": separation(a_G, b_G, sigma_G, keep_G)
             for (a, a_G), (b, b_G) in zip(ordered, ordered[1:])}
    return {"sigma": float(sigma_G[keep_G].mean()), "pairs": pairs,
            "met": min(pairs.values()) >= TARGET_SEPARATION}


def family_runs_KxR(runs: list, group: str) -> list[list]:
    """The family's runs of one recipe as sizes × seeds (sizes in the order they were given)."""
    sizes = list(dict.fromkeys(r.label for r in runs if r.group == group))
    return [[r for r in runs if r.group == group and r.label == s] for s in sizes]


def _trend_met(measures: dict) -> bool:
    return bool(abs(measures["trend"]) <= TARGET_TREND)


def _floor_met(measures: dict) -> bool:
    return bool(measures["delta_over_sigma"] <= TARGET_FLOOR_MULTIPLE * measures["floor"])


def family_panel(curves: dict, runs: list, frac_G: np.ndarray, n_params: dict[str, int]) -> dict:
    """Panel 3: `curves.family_measures` of each recipe's family (trend against ln N, Δ/σ with its floor, the
    paper's MAE), the τ family's targets, and the naive / τ ratio of MAEs (reported, no target)."""
    from celerity_jax.collapse import compare, curves as curve_math

    out = {}
    for name in RECIPES:
        grid = family_runs_KxR(runs, name)
        seeds = max(len(row) for row in grid)
        curves_KxRxG = np.full((len(grid), seeds, len(frac_G)), np.nan)
        for k, row in enumerate(grid):
            for j, r in enumerate(row):
                curves_KxRxG[k, j] = curves[r.name]
        n_params_K = [n_params[row[0].name] for row in grid]
        out[name] = {"sizes": [row[0].label for row in grid], "n_params": n_params_K,
                     **curve_math.family_measures(curves_KxRxG, n_params_K, frac_G, *compare.QUALITY_RANGE)}
    tau = out["tau"]
    tau["met"] = _trend_met(tau) and _floor_met(tau)
    out["mae_ratio"] = out["naive"]["mae"] / tau["mae"]
    out["met"] = tau["met"]
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def plot_panels(frac_G: np.ndarray, curves: dict, runs: list, panels: dict, path: str) -> None:
    """One column per panel: normalized curves above, and below each curve's residual from the panel's reference
    curve in units of the panel's σ (the band is ±3σ); written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base_G = _group(curves, runs, "timescale", "base").mean(axis=0)
    columns = []  # (title, [(label, curve, style)], reference, σ)
    if "timescale" in panels:
        p = panels["timescale"]
        equal = [("base (seed mean)", base_G, "-")] + [
            (r.label, curves[r.name], "-" if r.tau_factor == 1 else "--")
            for r in runs if r.group == "timescale" and r.label != "base"]
        reference = np.mean([c for _, c, style in equal if style == "-"], axis=0)
        columns.append((f"1. equal τ (solid) vs τ/4, 4τ (dashed)\nΔ/σ {p['delta_over_sigma']:.2f}, off-τ "
                        f"{min(p['off'].values()):.1f}σ+", equal, reference, p["sigma"]))
    if "tpp" in panels:
        p = panels["tpp"]
        lines = [("tpp-half", curves["tpp/tpp-half"], "--"), ("base (seed mean)", base_G, "-"),
                 ("tpp-x2", curves["tpp/tpp-x2"], "--")]
        columns.append((f"2. TPP ×½, ×1, ×2 at one τ\nadjacent pairs {min(p['pairs'].values()):.1f}σ+", lines,
                        base_G, p["sigma"]))
    if "family" in panels:
        p = panels["family"]
        lines = []
        for name, style in zip(RECIPES, ("-", "--")):
            for row in family_runs_KxR(runs, name):
                lines.append((f"{name}/{row[0].label} ({len(row)} seeds)",
                              np.mean([curves[r.name] for r in row], axis=0), style))
        columns.append((f"3. family {p['tau']['sizes'][0]}–{p['tau']['sizes'][-1]}: τ (solid) vs naive (dashed)\n"
                        f"τ: trend {p['tau']['trend']:+.1f} SE, Δ/σ {p['tau']['delta_over_sigma']:.2f} (floor "
                        f"{p['tau']['floor']:.2f}); naive: {p['naive']['trend']:+.1f} SE", lines, None,
                        p["tau"]["sigma"]))
    fig, axes = plt.subplots(2, len(columns), figsize=(5.5 * len(columns), 7), sharex=True, height_ratios=(2, 1),
                             squeeze=False)
    late = frac_G >= 0.1
    for (title, lines, reference, sigma), top, bottom in zip(columns, axes[0], axes[1]):
        for label, l_G, style in lines:
            ref_G = reference if reference is not None else np.mean(
                [c for other, c, s in lines if s == style], axis=0)
            line, = top.plot(frac_G[late], l_G[late], style, lw=1.2, label=label)
            bottom.plot(frac_G[late], (l_G - ref_G)[late] / sigma, style, lw=1.0, color=line.get_color())
        bottom.axhspan(-TARGET_SEPARATION, TARGET_SEPARATION, color="0.9")
        bottom.axhline(0.0, color="k", lw=0.8)
        top.set_title(title, fontsize=10)
        top.legend(fontsize=7)
        bottom.set_xlabel("fraction of training t̂")
    axes[0, 0].set_ylabel("normalized eval loss L(t̂)/L(T)")
    axes[1, 0].set_ylabel("residual / σ (band ±3σ)")
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)


def _runs_table(workdir: str, runs: list, finals: dict, seconds: dict) -> tuple[list[str], dict]:
    rows, facts = [], {}
    for r in runs:
        with open(os.path.join(r.workdir(workdir), "plan.json")) as f:
            plan = json.load(f)
        final = float(finals[r.name])
        facts[r.name] = {"n_params": plan["n_params"], "tpp": plan["tpp"], "tau": plan["tau"],
                         "weight_decay": plan["weight_decay"], "batch_seqs": plan["batch_seqs"],
                         "base_lr": plan["base_lr"], "steps": plan["steps"], "tokens": plan["tokens"],
                         "final_eval_loss": final,
                         "seconds": seconds.get(r.name)}
        rows.append([r.name, f"{plan['n_params']:,}", f"{plan['tpp']:.2f}", f"{plan['tau']:.3f}",
                     f"{plan['weight_decay']:.3g}", plan["batch_seqs"], f"{plan['base_lr']:.3g}", plan["steps"],
                     f"{final:.4f}", f"{seconds.get(r.name, float('nan')):.0f}"])
    return markdown.table(["run", "N", "TPP", "tau", "weight decay", "batch (seqs)", "base LR", "steps",
                           "final eval loss", "time (s)"], rows), facts


def _panel_lines(panels: dict, base: dict) -> list[str]:
    """The report's section of each panel; `base`: the facts of panel 1's base run."""
    at = f"At the smallest size (N = {base['n_params']:,}), {base['tpp']:g} TPP"
    lines = []
    if "timescale" in panels:
        p = panels["timescale"]
        off = ", ".join(f"{name} **{x:.1f}σ**" for name, x in p["off"].items())
        lines += ["## 1. τ, not B, η and λ separately, sets the curve's shape", "",
                  f"{at}: the τ recipe's run (base, τ = {base['tau']:.3f}, with its seeds) and the settings at equal τ "
                  f"({', '.join(p['equal'])}), against τ/4 "
                  "(tau-div4) and 4τ (tau-x4).",
                  "",
                  f"- Equal-τ settings agree within seed noise: Δ/σ = {p['delta']:.4f} / {p['sigma']:.4f} = "
                  f"**{p['delta_over_sigma']:.2f}** (target <= {TARGET_DELTA_OVER_SIGMA:g}: "
                  f"{_met(p['delta_over_sigma'] <= TARGET_DELTA_OVER_SIGMA)})",
                  f"- Off-τ curves from the equal-τ mean: {off} (target >= {TARGET_SEPARATION:g}σ each: "
                  f"{_met(min(p['off'].values()) >= TARGET_SEPARATION)})", ""]
    if "tpp" in panels:
        p = panels["tpp"]
        pairs = ", ".join(f"{pair.replace('|', ' vs ')} **{x:.1f}σ**" for pair, x in p["pairs"].items())
        lines += ["## 2. TPP sets the shape too", "",
                  f"{at} (base) and half and twice that, all at base's τ = {base['tau']:.3f} (σ = {p['sigma']:.4f}).",
                  "",
                  f"- Adjacent curves apart: {pairs} (target >= {TARGET_SEPARATION:g}σ each: {_met(p['met'])})", ""]
    if "family" in panels:
        p = panels["family"]
        tau = p["tau"]
        lines += ["## 3. A family at one TPP and one τ collapses", "",
                  f"Sizes {', '.join(f'{s} (N = {n:,})' for s, n in zip(tau['sizes'], tau['n_params']))}: "
                  f"{tau['n_params'][-1] / tau['n_params'][0]:.2f}× in N. ℓ̄ is a curve's mean over t̂ in [0.2, 1]; "
                  "the trend is the slope of the seed-mean ℓ̄ against ln N over its standard error from seed noise; Δ/σ "
                  "is the spread across sizes of the seed-mean curves against seed noise, beside the floor "
                  "√((K−1)/(K·R)) that sizes with no difference show; MAE is the paper's metric, mean |ℓ_k − family "
                  "mean| of each size's seed-mean curve.", ""]
        lines += markdown.table(["recipe", "seeds per size", "ℓ̄ slope per ln N", "trend (SE)", "Δ/σ", "floor",
                                 "MAE by size", "MAE"],
                                [[name, "/".join(map(str, m["seeds"])), f"{m['trend_slope']:+.4f} ± {m['trend_se']:.4f}",
                                  f"{m['trend']:+.1f}", f"{m['delta_over_sigma']:.2f}", f"{m['floor']:.2f}",
                                  " / ".join(f"{x:.4f}" for x in m["mae_by_size"]), f"{m['mae']:.4f}"]
                                 for name, m in ((n, p[n]) for n in RECIPES)])
        lines += ["",
                  f"- τ family, trend: **{tau['trend']:+.1f} SE** (target |trend| <= {TARGET_TREND:g}: "
                  f"{_met(_trend_met(tau))})",
                  f"- τ family, Δ/σ: **{tau['delta_over_sigma']:.2f}** against a floor of {tau['floor']:.2f} "
                  f"(target <= {TARGET_FLOOR_MULTIPLE:g} × floor = {TARGET_FLOOR_MULTIPLE * tau['floor']:.2f}: "
                  f"{_met(_floor_met(tau))})",
                  f"- The naive family (no target): trend {p['naive']['trend']:+.1f} SE, Δ/σ "
                  f"{p['naive']['delta_over_sigma']:.2f}, MAE {p['naive']['mae']:.4f}, {p['mae_ratio']:.2f}× the τ "
                  "family's.", ""]
    return lines


DESIGN_TITLES = {"quick": "quick (panels 1 and 2)", "default": "panels 1, 2 and 3", "full": "--full (panels 1, 2 "
                 "and 3, the wider family)"}


def regime_check(facts: dict[str, dict]) -> dict:
    """Which runs are shorter than the short-run regime (`collapse.regime`), with its thresholds."""
    from celerity_jax.collapse import regime

    return {"min_steps": regime.MIN_STEPS, "min_tokens": regime.MIN_TOKENS,
            "outside": sorted(name for name, f in facts.items() if regime.outside(f["steps"], f["tokens"]))}


def write_report(workdir: str, runs: list, seconds: dict[str, float], design: str, variant: tuple[str, ...] = (),
                 downstream: dict[str, dict] | None = None, wall_seconds: float | None = None) -> dict:
    """Measures every panel the runs cover, writes demo.png, report.md and report.json, and returns the latter's
    content. `seconds`: each run's training time by name; `design`: "quick", "default" or "full"; `downstream`:
    the τ family's results files (`demo.score_downstream`), for the downstream table and frontier.png;
    `wall_seconds`: the demo command's time until the report, when known."""
    frac_G, curves, finals = normalized_curves(workdir, runs)
    keep_G = quality_range(frac_G)
    table, facts = _runs_table(workdir, runs, finals, seconds)
    groups = {r.group for r in runs}
    panels = {}
    if "timescale" in groups:
        panels["timescale"] = timescale_panel(curves, runs, keep_G)
    if "tpp" in groups:
        panels["tpp"] = tpp_panel(curves, runs, keep_G)
    if "naive" in groups:
        panels["family"] = family_panel(curves, runs, frac_G, {name: f["n_params"] for name, f in facts.items()})
    plot_panels(frac_G, curves, runs, panels, os.path.join(workdir, "demo.png"))
    regime = regime_check(facts)
    wall = f"; {wall_seconds / 60:.1f} min in all" if wall_seconds is not None else ""
    lines = ["# celerity demo: the paper's mechanism, against seed noise", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}; "
             f"{DESIGN_TITLES[design]}; {time.strftime('%Y-%m-%d %H:%M')}; training {sum(seconds.values()) / 60:.1f} "
             f"min{wall}." + (f" Layered on every run: {'; '.join(variant)}." if variant else ""), "",
             "The measure: each run's eval loss on the same held-out batches at 50 points of t̂, divided by its final "
             f"value, on {GRID_BINS} bins, over t̂ in [0.2, 1]. σ is the spread across seeds of one setting "
             "(panels 1 and 2: timescale/base and its repeats; panel 3: each recipe's sizes, each with its seeds).", "",
             f"Every run should sit in the regime where a curve's shape no longer moves with the run's length: at least "
             f"{regime['min_steps']:,} steps and {regime['min_tokens']:,} tokens (docs/science.md, the short-run "
             "regime). " + (f"**Outside it: {', '.join(regime['outside'])}.**" if regime["outside"]
                            else "All of them do."), "",
             "![demo](demo.png)", ""]
    lines += _panel_lines(panels, facts["timescale/base"])
    lines += ["## Runs", ""] + table + [""]
    summary = {"quick": design == "quick", "design": design, "train_seconds": sum(seconds.values()),
               "wall_seconds": wall_seconds, "regime": regime, **panels,
               "runs": facts}
    if downstream:
        downstream_lines, summary["downstream"] = _downstream_report(workdir, downstream)
        lines += downstream_lines
    write_text_atomic(os.path.join(workdir, "report.md"), "\n".join(lines))
    write_json_atomic(os.path.join(workdir, "report.json"), summary)
    return summary


def _downstream_report(workdir: str, downstream: dict[str, dict]) -> tuple[list[str], dict]:
    """The report's downstream section and summary: the tau family's built-in-task scores by size, whether they
    rise with size, and frontier.png with the paper's form fitted to them (or why there is no fit)."""
    from celerity_jax.evaluate import builtin_task, frontier, results

    task = builtin_task.TASK_NAME
    by_size = sorted(downstream.items(), key=lambda item: item[1]["n_params"])
    scores = {name: c["tasks"][task] for name, c in by_size}
    rows = [[name, f"{c['n_params']:,}", f"{c['train_flops']:.3g}", f"{100 * scores[name]['value']:.2f}",
             f"{100 * scores[name]['stderr']:.2f}", scores[name]["docs"]] for name, c in by_size]
    accs = [scores[name]["value"] for name, _ in by_size]
    rising = all(a < b for a, b in zip(accs, accs[1:]))
    lines = ["## Downstream: the built-in task", "",
             f"The tau family's final checkpoints scored by `celerity eval --tasks {task}`: pick the true rest of a "
             "held-out standard-library line among 4 (chance 25%), metric acc.", ""]
    lines += markdown.table(["run", "N", "training FLOPs", "acc (%)", "stderr (%)", "documents"], rows)
    by_n = ", ".join(f"{name.split('/')[1]} {100 * a:.2f}%" for (name, _), a in zip(by_size, accs))
    lines += ["", f"- Larger sizes score higher: **{'yes' if rising else 'no'}** ({by_n}, in order of N)."]
    points = frontier.load_points([results.result_path(c["workdir"], c["step"]) for _, c in by_size])
    try:
        fit = frontier.fit_frontier([p.flops for p in points], [p.accuracy for p in points])
    except ConfigError as e:
        lines += [f"- No frontier fit: {e}.", ""]
        return lines, {"rising": rising, "scores": scores, "fit": None}
    frontier.plot_frontier(points, frontier.load_published(), fit, os.path.join(workdir, "frontier.png"))
    lines += [f"- The paper's form {frontier.FORM} fitted to them: k = {fit.k:.4g}, log10 C₀ = {fit.log10_c0:.4g}. "
              "The paper's points (its seven tasks) are drawn on their own axis: a different measure.", "",
              "![frontier](frontier.png)", ""]
    return lines, {"rising": rising, "scores": scores, "fit": {"k": fit.k, "log10_c0": fit.log10_c0}}
