"""The short-run regime study's measures, fits, figure and results files (the runs are `run.py`'s).

A run's shape is m = mean(ℓ − 1) over t̂ in [0.2, 1], ℓ its eval curve on 25 bins divided by its last bin (the
demo's measure). The study asks which of steps T, tokens D and parameters N (or TPP = D/N) m follows, and from
where on it stops following them:

- least squares of m on ln T, ln D and ln N together, and on each alone, over the baseline cells;
- a broken stick in both at once, m = m∞ + s_T·min(ln T − ln T*, 0) + s_D·min(ln D − ln D*, 0), fitted by grid
  search on (T*, D*) over the d40-l2 baseline runs, with the knees' spread over resampled seeds: T* and D* are
  where the rise stops;
- the candidates: the rise from 166 to 1,324 steps (tpp2 → tpp16 at a batch of 16) under each candidate
  change, against the baseline's.
"""

import json
import os
import platform
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GRID_BINS = 25
BASELINE_CELLS = ("tokens", "batch", "steps", "params", "long")
CANDIDATES = {"beta2": "β2 from a half-life of 2% of t̂", "noclip": "gradient clipping off"}


def load_runs(workdir: str) -> list[dict]:
    """Every finished run under `workdir`: its name, cell, seed, plan facts and m."""
    from celerity_jax.collapse import curves, files
    from celerity_jax.errors import ConfigError

    from run import cells

    out = []
    for name in cells():
        cell_dir = os.path.join(workdir, *name.split("/"))
        parent, label = os.path.dirname(cell_dir), os.path.basename(cell_dir)
        if not os.path.isdir(parent):
            continue
        for entry in sorted(os.listdir(parent)):
            if not entry.startswith(label + "-seed"):
                continue
            path = os.path.join(parent, entry)
            if not os.path.isfile(os.path.join(path, "plan.json")):
                continue
            with open(os.path.join(path, "plan.json")) as f:
                plan = json.load(f)
            try:
                curve = files.load_curve(path, loss="eval")
            except ConfigError:  # started, no eval yet
                continue
            if not curve.finished:
                continue
            ell_G = curves.normalize_run(curve, GRID_BINS, 1)[0]
            keep_G = curves.bin_centers(GRID_BINS) >= 0.2
            out.append({"name": name, "cell": name.split("/")[0], "seed": int(entry.rsplit("seed", 1)[1]),
                        "n_params": plan["n_params"], "tpp": plan["tpp"], "tokens": plan["tokens"],
                        "batch_seqs": plan["batch_seqs"], "steps": plan["steps"], "weight_decay": plan["weight_decay"],
                        "adam_b2": plan["adam_b2"], "grad_clip": plan["grad_clip"],
                        "final_eval_loss": float(curve.loss_T[-1]), "m": float(np.mean(ell_G[keep_G] - 1)),
                        "ell": [float(x) for x in ell_G]})
    return out


def ols(y: np.ndarray, columns: dict[str, np.ndarray]) -> dict:
    """Least squares of y on a constant and the named columns: coefficients, standard errors, rms residual."""
    x = np.column_stack([np.ones(len(y))] + list(columns.values()))
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    dof = max(len(y) - x.shape[1], 1)
    cov = (resid @ resid / dof) * np.linalg.pinv(x.T @ x)
    return {"coef": {k: float(c) for k, c in zip(columns, coef[1:])},
            "se": {k: float(s) for k, s in zip(columns, np.sqrt(np.diag(cov))[1:])},
            "rms_residual": float(np.sqrt(np.mean(resid**2))), "n": int(len(y))}


def broken_stick(ln_steps: np.ndarray, ln_tokens: np.ndarray, y: np.ndarray, grid: int = 60) -> dict:
    """m = m∞ + s_T·min(ln T − ln T*, 0) + s_D·min(ln D − ln D*, 0), least squares at each pair of knees
    (T*, D*) on a grid over the data's range; the best pair. A knee at the data's low end means no rise there."""
    best = None
    for knee_t in np.linspace(ln_steps.min(), ln_steps.max(), grid):
        for knee_d in np.linspace(ln_tokens.min(), ln_tokens.max(), grid):
            a = np.column_stack([np.ones_like(y), np.minimum(ln_steps - knee_t, 0.0), np.minimum(ln_tokens - knee_d, 0.0)])
            coef, *_ = np.linalg.lstsq(a, y, rcond=None)
            rss = float(np.sum((y - a @ coef) ** 2))
            if best is None or rss < best["rss"]:
                best = {"min_steps": float(np.exp(knee_t)), "min_tokens": float(np.exp(knee_d)),
                        "plateau": float(coef[0]), "slope_steps": float(coef[1]), "slope_tokens": float(coef[2]),
                        "rss": rss}
    best["rms_residual"] = float(np.sqrt(best["rss"] / len(y)))
    return best


def knees(runs: list[dict], resamples: int = 200) -> dict:
    """The broken stick over every seed of the d40-l2 baseline runs, and the 10th–90th percentiles of its knees
    over resamples that draw one seed of each run at random."""
    small = [r for r in runs if r["cell"] in BASELINE_CELLS and r["n_params"] == min(x["n_params"] for x in runs)]

    def fit(rs, grid):
        return broken_stick(np.log([r["steps"] for r in rs]), np.log([r["tokens"] for r in rs]),
                            np.array([r["m"] for r in rs]), grid)

    best = fit(small, 60)
    rng = np.random.default_rng(0)
    names = sorted({r["name"] for r in small})
    draws = []
    for _ in range(resamples):
        pick = []
        for name in names:
            seeds = [r for r in small if r["name"] == name]
            pick.append(seeds[rng.integers(len(seeds))])
        draws.append(fit(pick, 30))
    for key in ("min_steps", "min_tokens"):
        best[f"{key}_p10_p90"] = [float(np.percentile([d[key] for d in draws], q)) for q in (10, 90)]
    best["runs"] = len(small)
    return best


def cell_means(runs: list[dict]) -> dict[str, dict]:
    """By run name: the seeds' mean m, its standard error and the run's plan facts."""
    out = {}
    for name in dict.fromkeys(r["name"] for r in runs):
        rs = [r for r in runs if r["name"] == name]
        m = np.array([r["m"] for r in rs])
        out[name] = {**{k: rs[0][k] for k in ("cell", "n_params", "tpp", "tokens", "batch_seqs", "steps",
                                                 "weight_decay", "adam_b2", "grad_clip")},
                     "m": float(m.mean()), "m_se": float(m.std(ddof=1) / np.sqrt(len(m))) if len(m) > 1 else None,
                     "seeds": len(m), "final_eval_loss": float(np.mean([r["final_eval_loss"] for r in rs]))}
    return out


def analyse(runs: list[dict]) -> dict:
    base = [r for r in runs if r["cell"] in BASELINE_CELLS]
    y = np.array([r["m"] for r in base])
    ln = {k: np.log(np.array([r[k] for r in base], float)) for k in ("steps", "tokens", "n_params", "tpp")}
    fits = {"steps+tokens+params": ols(y, {"ln_steps": ln["steps"], "ln_tokens": ln["tokens"],
                                              "ln_params": ln["n_params"]}),
            "steps": ols(y, {"ln_steps": ln["steps"]}), "tokens": ols(y, {"ln_tokens": ln["tokens"]}),
            "tpp": ols(y, {"ln_tpp": ln["tpp"]})}
    sticks = knees(runs)
    seed_sd = float(np.sqrt(np.mean([np.var([r["m"] for r in runs if r["name"] == n], ddof=1)
                                     for n in {r["name"] for r in runs}
                                     if sum(r["name"] == n for r in runs) > 1])))
    means = cell_means(runs)

    def rise(cell: str) -> dict | None:
        short, long_ = f"{cell}/tpp2-b16", f"{cell}/tpp16-b16"
        if short not in means or long_ not in means:
            return None
        a, b = means[short], means[long_]
        return {"short": a["m"], "long": b["m"], "rise": b["m"] - a["m"],
                "se": float(np.hypot(a["m_se"] or 0, b["m_se"] or 0))}

    candidates = {"baseline": rise("tokens"), **{c: rise(c) for c in CANDIDATES}}
    same = {"lr/tpp8-b32-lr2": ("batch/tpp8-b32", "tokens/tpp8-b16"), "lr/tpp8-b16-lr0.5": ("tokens/tpp8-b16", "batch/tpp8-b32"),
            "lr/tpp8-b8-lr0.5": ("batch/tpp8-b8", "tokens/tpp8-b16")}
    lr_test = {name: {"m": means[name]["m"], "m_se": means[name]["m_se"], "steps": means[name]["steps"],
                      "same_steps": {"run": a, "m": means[a]["m"]}, "same_summed_lr": {"run": b, "m": means[b]["m"]}}
               for name, (a, b) in same.items() if all(x in means for x in (name, a, b))}
    return {"lr_test": lr_test, "fits": fits, "broken_stick": sticks, "seed_sd_of_m": seed_sd, "cells": means,
            "candidates": {k: v for k, v in candidates.items() if v is not None}}


def plot(runs: list[dict], result: dict, path: str) -> None:
    """(a) m against steps, (b) m against tokens, each run's seed mean with its standard error and the broken
    stick's section where the other variable is past its knee; (c) three curves of one N and D at three batches."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from celerity_jax.collapse import curves, regime
    from celerity_jax.fileio import save_figure_atomic

    means, stick = result["cells"], result["broken_stick"]
    threshold = {"steps": regime.MIN_STEPS, "tokens": regime.MIN_TOKENS}
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    markers = {"tokens": "o", "batch": "s", "steps": "^", "params": "D", "long": "*"}
    for ax, key, other, label in ((axes[0], "steps", "tokens", "steps T"), (axes[1], "tokens", "steps", "tokens D")):
        seen = set()
        for c in means.values():
            if c["cell"] not in markers:
                continue
            past = c[other] >= stick[f"min_{other}"]
            color = "tab:blue" if past else "tab:orange"
            tag = (c["cell"], past, c["n_params"])
            ax.errorbar(c[key], c["m"], yerr=c["m_se"] or 0, fmt=markers[c["cell"]], ms=6, capsize=2, color=color,
                        mfc="none" if c["n_params"] != 84_760 else color,
                        label=(f"{c['cell']}" + (f" N={c['n_params']:,}" if c["n_params"] != 84_760 else "")
                               + f", {other} {'≥' if past else '<'} knee") if tag not in seen else None)
            seen.add(tag)
        xs = np.exp(np.linspace(np.log(min(c[key] for c in means.values())),
                                np.log(max(c[key] for c in means.values())), 100))
        ax.plot(xs, stick["plateau"] + stick[f"slope_{key}"] * np.minimum(np.log(xs / stick[f"min_{key}"]), 0), "k--",
                lw=1, label=f"broken stick, knee {stick[f'min_{key}']:,.0f}")
        ax.axvline(threshold[key], color="0.6", lw=1, ls=":", label=f"regime threshold {threshold[key]:,}")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:,.0f}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(label)
        ax.set_title(f"shape m against {label} (filled: N = 84,760)", fontsize=10)
        ax.legend(fontsize=6)
    axes[0].set_ylabel("m = mean(ℓ − 1) over t̂ ∈ [0.2, 1]")
    frac_G = curves.bin_centers(GRID_BINS)
    late = frac_G >= 0.1
    for name in ("batch/tpp8-b64", "tokens/tpp8-b16", "batch/tpp8-b4"):
        rs = [r for r in runs if r["name"] == name]
        if rs:
            axes[2].plot(frac_G[late], np.mean([r["ell"] for r in rs], axis=0)[late],
                         label=f"{name}: {rs[0]['steps']} steps, {rs[0]['tokens']:,} tokens")
    axes[2].set_title("one N, one D, three batches: the shorter run flattens sooner", fontsize=10)
    axes[2].set_xlabel("fraction of training t̂")
    axes[2].set_ylabel("normalized eval loss ℓ (seed mean)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)


def write_results(workdir: str) -> dict:
    from celerity_jax import markdown
    from celerity_jax.fileio import write_json_atomic, write_text_atomic

    runs = load_runs(workdir)
    result = analyse(runs)
    plot(runs, result, os.path.join(HERE, "regime.png"))
    rows = [[name, c["cell"], f"{c['n_params']:,}", f"{c['tpp']:.2f}", f"{c['tokens']:,}", c["batch_seqs"],
             c["steps"], f"{c['weight_decay']:.3g}", f"{c['adam_b2']:.4g}", f"{c['grad_clip']:g}", c["seeds"],
             f"{c['m']:.4f} ± {c['m_se']:.4f}" if c["m_se"] is not None else f"{c['m']:.4f}",
             f"{c['final_eval_loss']:.4f}"]
            for name, c in result["cells"].items()]
    fits = result["fits"]
    full = fits["steps+tokens+params"]
    lines = ["# The short-run regime: results", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores; written {time.strftime('%Y-%m-%d %H:%M')} "
             f"by `python experiments/short_run_regime/run.py` from {len(runs)} runs.", "",
             "m = mean(ℓ − 1) over t̂ ∈ [0.2, 1] of each run's normalized eval curve (25 bins, divided by the last). "
             f"Seed standard deviation of m (pooled): {result['seed_sd_of_m']:.4f}.", "",
             "![regime](regime.png)", "", "## Runs (mean over seeds)", ""]
    lines += markdown.table(["run", "cell", "N", "TPP", "tokens", "batch (seqs)", "steps", "λ", "β2", "clip", "seeds",
                             "m ± se", "final eval loss"], rows)
    lines += ["", "## What m follows (least squares over the baseline cells, every seed a point)", "",
              "- Together: " + ", ".join(f"{k} {v:+.4f} ± {full['se'][k]:.4f}" for k, v in full["coef"].items()) + "; "
              f"rms residual {full['rms_residual']:.4f} ({full['n']} runs).",
              *[f"- {k} alone: slope {next(iter(f['coef'].values())):+.4f}, rms residual {f['rms_residual']:.4f}"
                for k, f in fits.items() if k != "steps+tokens+params"], "",
              "## The threshold (broken stick in steps and tokens over the d40-l2 baseline runs)", ""]
    st = result["broken_stick"]
    lines += [f"m = m∞ + s_T·min(ln T − ln T*, 0) + s_D·min(ln D − ln D*, 0), fitted over {st['runs']} runs "
              "(every seed a point; the range is the 10th–90th percentile over 200 resamples drawing one seed per run):",
              "",
              f"- T* = **{st['min_steps']:,.0f} steps** ({st['min_steps_p10_p90'][0]:,.0f}–{st['min_steps_p10_p90'][1]:,.0f}), "
              f"slope below it {st['slope_steps']:+.4f} per ln T",
              f"- D* = **{st['min_tokens']:,.0f} tokens** ({st['min_tokens_p10_p90'][0]:,.0f}–"
              f"{st['min_tokens_p10_p90'][1]:,.0f}), slope below it {st['slope_tokens']:+.4f} per ln D",
              f"- plateau m∞ = {st['plateau']:.4f}; rms residual {st['rms_residual']:.4f}"]
    lines += ["", "## Steps or the LR summed over them? (8 TPP, batch × LR moved, τ held)", ""]
    for name, t in result["lr_test"].items():
        lines.append(f"- {name} ({t['steps']} steps): m {t['m']:.4f}; the run with its steps, {t['same_steps']['run']}: "
                     f"{t['same_steps']['m']:.4f}; the run with its summed LR, {t['same_summed_lr']['run']}: "
                     f"{t['same_summed_lr']['m']:.4f}")
    lines += ["", "## The step-scaled candidates: the rise of m from 166 to 1,324 steps (2 → 16 TPP, batch 16)", ""]
    for name, c in result["candidates"].items():
        lines.append(f"- {CANDIDATES.get(name, 'baseline (β2 0.95, clip 1.0)')}: {c['short']:.4f} → {c['long']:.4f}, "
                     f"rise **{c['rise']:+.4f} ± {c['se']:.4f}**")
    write_text_atomic(os.path.join(HERE, "results.md"), "\n".join(lines) + "\n")
    write_json_atomic(os.path.join(HERE, "results.json"),
                      {**{k: v for k, v in result.items()},
                       "runs": [{k: v for k, v in r.items() if k != "ell"} for r in runs]})
    print("\n".join(lines[lines.index("## What m follows (least squares over the baseline cells, every seed a point)"):]))
    return result
