"""The MoE collapse experiment's measures, figure and results files (the runs are `run.py`'s).

A run's shape is m = mean(ℓ − 1) over t̂ in [0.2, 1], ℓ its eval curve on 25 bins divided by its last bin (the
measure of the demo and of the short-run regime study). The dense family's m moves with its TPP; the question is
whether the MoE runs' m moves the same way with their tokens per expert, TPP/E:

- slope of m against ln TPP over the dense runs (the E = 1 run is the dense run at TPP_MOE), and against
  ln(TPP/E) over the MoE runs, each with its standard error; their difference in standard errors;
- for each E > 1, m of the MoE run minus m of the dense run at TPP/E, in standard errors.

Standard errors use the seed standard deviation pooled over every run (one degree of freedom per extra seed).
"""

import json
import os
import platform
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GRID_BINS = 25
SIGMAS = 3.0


def load_runs(workdir: str) -> list[dict]:
    """Every finished run under `workdir`: its name, arm, E, seed, plan facts, m and normalized curve."""
    from celerity_jax.collapse import curves, files
    from celerity_jax.errors import ConfigError

    from run import cells

    out = []
    for name, (experts, _, _) in cells().items():
        for seed_dir in sorted(_seed_dirs(workdir, name)):
            with open(os.path.join(seed_dir, "plan.json")) as f:
                plan = json.load(f)
            try:
                curve = files.load_curve(seed_dir, loss="eval")
            except ConfigError:  # started, no eval yet
                continue
            if not curve.finished:
                continue
            ell_G = curves.normalize_run(curve, GRID_BINS, 1)[0]
            keep_G = curves.bin_centers(GRID_BINS) >= 0.2
            out.append({"name": name, "arm": name.split("/")[0], "experts": experts,
                        "seed": int(seed_dir.rsplit("seed", 1)[1]), "n_params": plan["n_params"], "tpp": plan["tpp"],
                        "tpp_per_expert": plan["tpp"] / experts, "tokens": plan["tokens"],
                        "batch_seqs": plan["batch_seqs"], "steps": plan["steps"],
                        "weight_decay": plan["weight_decay"], "final_eval_loss": float(curve.loss_T[-1]),
                        "m": float(np.mean(ell_G[keep_G] - 1)), "ell": [float(x) for x in ell_G],
                        "load_max": _mean_load_max(seed_dir) if experts > 1 else 1.0})
    return out


def _mean_load_max(run_dir: str) -> float:
    """The run's moe/load_max (E × the largest expert's share of the routes, 1 when balanced), mean over its logs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return float(np.mean([e.value for e in events.Scalars("moe/load_max")]))


def _seed_dirs(workdir: str, name: str) -> list[str]:
    parent, label = os.path.split(os.path.join(workdir, *name.split("/")))
    if not os.path.isdir(parent):
        return []
    return [os.path.join(parent, e) for e in os.listdir(parent)
            if e.startswith(label + "-seed") and os.path.isfile(os.path.join(parent, e, "plan.json"))]


def _slope(x: np.ndarray, y: np.ndarray, sd: float) -> tuple[float, float]:
    """Least-squares slope of y on x and its standard error for points of noise sd."""
    dx = x - x.mean()
    return float(dx @ (y - y.mean()) / (dx @ dx)), float(sd / np.sqrt(dx @ dx))


def analyse(runs: list[dict]) -> dict:
    from run import TPP_MOE

    by_name: dict[str, list[dict]] = {}
    for r in runs:
        by_name.setdefault(r["name"], []).append(r)
    deviations = [r["m"] - np.mean([s["m"] for s in by_name[r["name"]]]) for r in runs]
    dof = len(runs) - len(by_name)
    seed_sd = float(np.sqrt(np.sum(np.square(deviations)) / dof)) if dof > 0 else float("nan")
    means = {}
    for name, rs in by_name.items():
        means[name] = {**{k: rs[0][k] for k in ("arm", "experts", "n_params", "tpp", "tpp_per_expert", "tokens",
                                                 "batch_seqs", "steps", "weight_decay", "load_max")},
                       "seeds": len(rs), "m": float(np.mean([r["m"] for r in rs])),
                       "m_se": seed_sd / np.sqrt(len(rs)),
                       "final_eval_loss": float(np.mean([r["final_eval_loss"] for r in rs])),
                       "ell": np.mean([r["ell"] for r in rs], axis=0).tolist()}
    dense = [r for r in runs if r["experts"] == 1]
    moe = [r for r in runs if r["arm"] == "moe"]
    result = {"seed_sd_of_m": seed_sd, "seed_dof": dof, "runs": means}
    if len({r["tpp"] for r in dense}) > 1 and len({r["experts"] for r in moe}) > 1:
        dense_slope = _slope(np.log([r["tpp"] for r in dense]), np.array([r["m"] for r in dense]), seed_sd)
        moe_slope = _slope(np.log([r["tpp_per_expert"] for r in moe]), np.array([r["m"] for r in moe]), seed_sd)
        result["slopes"] = {"dense_per_ln_tpp": dense_slope, "moe_per_ln_tpp_per_expert": moe_slope,
                            "moe_sigmas_from_zero": moe_slope[0] / moe_slope[1],
                            "dense_sigmas_from_zero": dense_slope[0] / dense_slope[1],
                            "difference_sigmas": (moe_slope[0] - dense_slope[0]) / np.hypot(moe_slope[1], dense_slope[1])}
    pairs = {}
    for name, c in means.items():
        partner = f"dense/tpp{TPP_MOE / c['experts']:g}"
        if c["arm"] == "moe" and c["experts"] > 1 and partner in means:
            d, se = c["m"] - means[partner]["m"], float(np.hypot(c["m_se"], means[partner]["m_se"]))
            pairs[name] = {"dense": partner, "difference": d, "se": se, "sigmas": d / se}
    result["pairs"] = pairs
    return result


def verdict(result: dict) -> str:
    """The sentence the results state: whether the MoE curves order by TPP/E, at SIGMAS or not."""
    s = result.get("slopes")
    if s is None:
        return "Not enough finished runs to judge."
    dense, moe = s["dense_per_ln_tpp"], s["moe_per_ln_tpp_per_expert"]
    orders = abs(s["moe_sigmas_from_zero"]) >= SIGMAS and np.sign(moe[0]) == np.sign(dense[0])
    matches = abs(s["difference_sigmas"]) < SIGMAS
    head = ("The MoE curves order by TPP per expert" if orders else
            "The MoE curves do not order by TPP per expert")
    return (f"{head} at {SIGMAS:g}σ: their m moves {moe[0]:+.4f} ± {moe[1]:.4f} per ln(TPP/E) "
            f"({s['moe_sigmas_from_zero']:+.1f}σ from zero), the dense family's {dense[0]:+.4f} ± {dense[1]:.4f} "
            f"per ln TPP ({s['dense_sigmas_from_zero']:+.1f}σ); the two slopes differ by "
            f"{s['difference_sigmas']:+.1f}σ ({'within' if matches else 'beyond'} {SIGMAS:g}σ).")


def plot(result: dict, path: str) -> None:
    """(a) the seed-mean normalized curves: MoE at each E (solid) and the dense run at TPP/E (dashed, same
    colour); (b) m against TPP per expert (MoE) and TPP (dense), with standard errors."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from celerity_jax.collapse import curves
    from celerity_jax.fileio import save_figure_atomic
    from run import EXPERTS, TPP_MOE

    runs = result["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    frac_G = curves.bin_centers(GRID_BINS)
    late = frac_G >= 0.1
    colors = dict(zip(EXPERTS, ("black", "tab:blue", "tab:orange", "tab:green")))
    for e in EXPERTS:
        moe, dense = runs.get(f"moe/e{e}"), runs.get(f"dense/tpp{TPP_MOE / e:g}")
        if moe:
            left.plot(frac_G[late], np.array(moe["ell"])[late], color=colors[e],
                      label=f"MoE E={e}, TPP/E={moe['tpp_per_expert']:g}")
        if dense and e > 1:
            left.plot(frac_G[late], np.array(dense["ell"])[late], color=colors[e], ls="--",
                      label=f"dense at TPP {dense['tpp']:g}")
    left.set_xlabel("fraction of training t̂")
    left.set_ylabel("normalized eval loss ℓ (seed mean)")
    left.set_title("hash-routed MoE (solid) and the dense run at TPP/E (dashed)", fontsize=10)
    left.legend(fontsize=7)
    for arm, key, marker in (("moe", "tpp_per_expert", "o"), ("dense", "tpp", "s")):
        cs = sorted((c for n, c in runs.items() if n.startswith(arm + "/") or (arm == "dense" and c["experts"] == 1)),
                    key=lambda c: c[key])
        right.errorbar([c[key] for c in cs], [c["m"] for c in cs], yerr=[c["m_se"] for c in cs], fmt=marker + "-",
                       capsize=3, label="MoE against TPP/E" if arm == "moe" else "dense against TPP")
    right.set_xscale("log", base=2)
    right.set_xlabel("TPP per expert (MoE), TPP (dense)")
    right.set_ylabel("m = mean(ℓ − 1) over t̂ ∈ [0.2, 1]")
    right.set_title("shape m", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)


def write_results(workdir: str) -> dict:
    from celerity_jax import markdown
    from celerity_jax.fileio import write_json_atomic, write_text_atomic

    runs = load_runs(workdir)
    result = analyse(runs)
    plot(result, os.path.join(HERE, "moe_collapse.png"))
    rows = [[name, c["experts"], f"{c['n_params']:,}", f"{c['tpp']:g}", f"{c['tpp_per_expert']:g}",
             f"{c['tokens']:,}", c["batch_seqs"], c["steps"], f"{c['weight_decay']:.3g}", f"{c['load_max']:.2f}",
             c["seeds"],
             f"{c['m']:.4f} ± {c['m_se']:.4f}", f"{c['final_eval_loss']:.4f}"]
            for name, c in result["runs"].items()]
    lines = ["# Mixture-of-experts collapse: results", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores; written {time.strftime('%Y-%m-%d %H:%M')} "
             f"by `python experiments/moe_collapse/run.py` from {len(runs)} runs.", "",
             f"**{verdict(result)}**", "",
             "m = mean(ℓ − 1) over t̂ ∈ [0.2, 1] of each run's normalized eval curve (25 bins, divided by the last). "
             f"Seed standard deviation of m, pooled: {result['seed_sd_of_m']:.4f} ({result['seed_dof']} degrees of "
             "freedom). N counts every expert; TPP = tokens / N. Load max: E × the busiest expert's share of the "
             "routes in the most unbalanced layer (1 when balanced), mean over the run's logs.", "",
             "![moe_collapse](moe_collapse.png)", "", "## Runs (mean over seeds)", ""]
    lines += markdown.table(["run", "E", "N", "TPP", "TPP/E", "tokens", "batch (seqs)", "steps", "λ", "load max",
                             "seeds",
                             "m ± se", "final eval loss"], rows)
    lines += ["", "## Each MoE run against the dense run at its TPP/E", ""]
    for name, p in result["pairs"].items():
        lines.append(f"- {name} − {p['dense']}: m differs by {p['difference']:+.4f} ± {p['se']:.4f} "
                     f"({p['sigmas']:+.1f}σ)")
    write_text_atomic(os.path.join(HERE, "results.md"), "\n".join(lines) + "\n")
    write_json_atomic(os.path.join(HERE, "results.json"),
                      {**{k: v for k, v in result.items() if k != "runs"}, "verdict": verdict(result),
                       "runs": {n: {k: v for k, v in c.items() if k != "ell"} for n, c in result["runs"].items()}})
    print("\n".join(lines[4:5] + lines[lines.index("## Each MoE run against the dense run at its TPP/E"):]))
    return result
