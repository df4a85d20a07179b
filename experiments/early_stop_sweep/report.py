"""results.md / results.json of the early-stopped sweep, from finished `celerity sweep` workdirs.

A section is one grid of settings swept once per seed (each seed its own workdir, same settings):

    python experiments/early_stop_sweep/report.py --out experiments/early_stop_sweep \
        --section 'main grid' runs/early_stop_sweep/main_seed0 runs/early_stop_sweep/main_seed1 \
        --section 'first grid' runs/early_stop_sweep/first_seed0
"""

import argparse
import json
import os
import platform
import time

import numpy as np

from celerity_jax import markdown
from celerity_jax.fileio import write_json_atomic, write_text_atomic

METHODS = {"family": "family-aware (d48 and d64 extrapolated in log N to d80)",
           "nearest": "nearest single reference (d64)"}


def load_sweep(workdir: str) -> dict:
    with open(os.path.join(workdir, "sweep.json")) as f:
        summary = json.load(f)
    if summary["true_ranking"] is None:
        raise SystemExit(f"{workdir}: the sweep has unfinished settings; run it without --stop-at")
    return summary


def wall_fraction(summary: dict, row: dict, method: str) -> float:
    """Share of the targets' measured seconds had every setting stopped at the fraction but the chosen
    ones (a stopped target charged that fraction of its time: steps cost about the same throughout)."""
    times = {s["name"]: s["seconds"] for s in summary["settings"]}
    used = sum(t if name in row[method]["chosen"] else t * row["fraction"] for name, t in times.items())
    return used / sum(times.values())


def analyse(workdirs: list[str]) -> dict:
    sweeps = [load_sweep(w) for w in workdirs]
    names = [s["name"] for s in sweeps[0]["settings"]]
    if any([s["name"] for s in sw["settings"]] != names for sw in sweeps):
        raise SystemExit(f"{workdirs}: the sweeps of a section must share their settings")
    finals_SxK = np.array([[s["final_loss"] for s in sw["settings"]] for sw in sweeps])
    mean_K = finals_SxK.mean(axis=0)
    best_mean = float(mean_K.min())
    mean_ranking = [names[i] for i in np.argsort(mean_K)]
    seeds = []
    for workdir, sw in zip(workdirs, sweeps):
        rows = []
        for row in sw["per_fraction"]:
            out = {"fraction": row["fraction"]}
            for method in METHODS:
                e = row[method]
                chosen = e["chosen"][0]
                out[method] = {"chosen": chosen, "ranking": e["ranking"], "regret": e["regret"],
                               "regret_vs_seed_mean": float(mean_K[names.index(chosen)] - best_mean),
                               "kendall_tau": e["kendall_tau"], "mean_abs_error": e["mean_abs_error"],
                               "errors": e["errors"], "separation_sigma": e["separation_sigma"],
                               "target_compute_fraction": e["target_compute_fraction"],
                               "total_compute_fraction": e["total_compute_fraction"],
                               "wall_fraction": wall_fraction(sw, row, method)}
            rows.append(out)
        seeds.append({"workdir": workdir, "true_ranking": sw["true_ranking"], "per_fraction": rows,
                      "target_seconds": sum(s["seconds"] for s in sw["settings"]),
                      "reference_seconds": sw["reference_seconds"]})
    section = {"settings": [{"name": s["name"], "tau": s["tau"], "weight_decay": s["weight_decay"],
                             "steps": s["steps"], "batch_seqs": s["batch_seqs"],
                             "final_loss_per_seed": finals_SxK[:, k].tolist(), "final_loss_mean": float(mean_K[k])}
                            for k, s in enumerate(sweeps[0]["settings"])],
               "seed_mean_ranking": mean_ranking, "seeds": seeds, "fractions": sweeps[0]["fractions"],
               "align_start": sweeps[0]["align_start"]}
    if len(sweeps) > 1:
        diff_K = finals_SxK[1] - finals_SxK[0]
        gaps = np.diff(np.sort(mean_K))
        # Within a seed every setting shares initialization and data order, so the seed change shifts all
        # settings alike (common_shift); the spread of the per-setting shifts across settings (paired_noise)
        # is the noise of a difference between two settings of one seed.
        section["seed_noise"] = {"seed_differences": diff_K.tolist(),
                                 "common_shift": float(np.mean(diff_K)),
                                 "paired_noise": float(np.std(diff_K, ddof=1)),
                                 "max_abs_seed_difference": float(np.max(np.abs(diff_K))),
                                 "gaps_between_adjacent_settings": gaps.tolist()}
    return section


def render_section(title: str, sec: dict) -> list[str]:
    n_seeds = len(sec["seeds"])
    lines = [f"## {title}", "", f"Workdirs: {', '.join('`' + s['workdir'] + '`' for s in sec['seeds'])}. "
             f"Early-align over t̂ in [{sec['align_start']:g}·f, f].", ""]
    best = min(s["final_loss_mean"] for s in sec["settings"])
    lines += markdown.table(
        ["setting", "τ", "λ (d80)", "final loss seed 0", *(f"seed {i}" for i in range(1, n_seeds)), "mean",
         "− best mean"],
        ([s["name"], f"{s['tau']:.3g}", f"{s['weight_decay']:.3g}", *(f"{x:.4f}" for x in s["final_loss_per_seed"]),
          f"{s['final_loss_mean']:.4f}", f"{s['final_loss_mean'] - best:+.4f}"] for s in sec["settings"]))
    lines.append("")
    for i, seed in enumerate(sec["seeds"]):
        lines.append(f"True ranking, seed {i}: " + " < ".join(seed["true_ranking"]) + ".")
    if n_seeds > 1:
        noise = sec["seed_noise"]
        lines += [f"Ranking of the seed means: {' < '.join(sec['seed_mean_ranking'])}.", "",
                  "Seed noise (seed 1 − seed 0 per setting): "
                  + ", ".join(f"{d:+.4f}" for d in noise["seed_differences"])
                  + f": a shift common to all settings of {noise['common_shift']:+.4f} (they share initialization "
                    f"and data order within a seed) and a spread across settings of {noise['paired_noise']:.4f} "
                    "(standard deviation), which is the noise of a difference between two settings of one seed. "
                    "Gaps between adjacent settings of the seed-mean ranking: "
                  + ", ".join(f"{g:.4f}" for g in noise["gaps_between_adjacent_settings"])
                  + f"; gaps below 2 × {noise['paired_noise']:.4f} are within seed noise."]
    lines.append("")
    for method, label in METHODS.items():
        lines += [f"### Predictions: {label}", ""]
        lines += markdown.table(
            ["seed", "fraction", "predicted winner", "regret (own seed)", "regret (seed mean)", "separation (σ)",
             "Kendall τ", "mean abs error", "target FLOPs", "with references", "target wall time"],
            ([i, f"{row['fraction']:g}", e["chosen"], f"{e['regret']:.4f}", f"{e['regret_vs_seed_mean']:.4f}",
              f"{e['separation_sigma']:.1f}", f"{e['kendall_tau']:.2f}", f"{100 * e['mean_abs_error']:.2f}%",
              f"{100 * e['target_compute_fraction']:.0f}%", f"{100 * e['total_compute_fraction']:.0f}%",
              f"{100 * e['wall_fraction']:.0f}%"]
             for i, seed in enumerate(sec["seeds"]) for row in seed["per_fraction"] for e in [row[method]]))
        lines += ["", "Error of each predicted final loss (predicted / true − 1):", ""]
        lines += markdown.table(
            ["setting", "seed", *(f"@{f:g}" for f in sec["fractions"])],
            ([s["name"], i, *(f"{100 * row[method]['errors'][s['name']]:+.2f}%" for row in seed["per_fraction"])]
             for s in sec["settings"] for i, seed in enumerate(sec["seeds"])))
        lines.append("")
    seconds = ", ".join(f"seed {i}: targets {s['target_seconds']:.0f} s, references {s['reference_seconds']:.0f} s"
                        for i, s in enumerate(sec["seeds"]))
    lines += [f"Measured training time ({seconds}).", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", nargs="+", action="append", required=True, metavar=("TITLE", "WORKDIR"),
                        help="a title and the sweep workdirs of its seeds (seed 0 first)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sections = {}
    for title, *workdirs in args.section:
        if not workdirs:
            raise SystemExit(f"--section {title!r}: give its sweep workdirs after the title")
        sections[title] = analyse(workdirs)
    lines = ["# Early-stopped τ sweep of tiny-d80: measured results", "",
             f"Written by `experiments/early_stop_sweep/report.py` on {time.strftime('%Y-%m-%d %H:%M')} "
             f"({platform.machine()}, {os.cpu_count()} CPU cores) from the sweeps' `sweep.json`. Regret: true final "
             "loss of the predicted winner minus the best true final loss (of the same seed, or of the seed "
             "means). Target FLOPs: training every setting to the fraction and only the predicted winner to the "
             "end, as a share of training every setting to the end; \"with references\" adds the d48 and d64 "
             "reference runs of every setting to both; target wall time: the same share of the targets' "
             "measured seconds. Separation: gap between the first two predictions over their combined 1σ "
             "(residual noise only).", ""]
    for title, sec in sections.items():
        lines += render_section(title, sec)
    write_json_atomic(os.path.join(args.out, "results.json"), sections)
    write_text_atomic(os.path.join(args.out, "results.md"), "\n".join(lines))
    print(f"wrote {args.out}/results.md and {args.out}/results.json")


if __name__ == "__main__":
    main()
