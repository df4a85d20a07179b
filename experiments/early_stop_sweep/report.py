"""results.md / results.json of the early-stopped sweep, from finished `celerity sweep` workdirs.

A section is one grid of settings swept once per seed (each seed its own workdir, same settings):

    python experiments/early_stop_sweep/report.py --out experiments/early_stop_sweep \
        --section 'τ 0.2–3.2' runs/early_stop_sweep/regime_seed0 runs/early_stop_sweep/regime_seed1

At every stop fraction it sets three decisions side by side: the predicted best (the sweep's prediction, by the
method chosen on all the settings' references), the current best (the lowest loss so far: no prediction) and the
oracle (every setting trained to the end: no regret, no compute saved), and checks the goals of a sweep that
stops early.
"""

import argparse
import json
import os
import platform
import time

import numpy as np

from celerity_jax import markdown
from celerity_jax.fileio import write_json_atomic, write_text_atomic
from celerity_jax.sweep.report import CURRENT_BEST

METHODS = {"auto": "the sweep's choice (`--method auto`: per fraction, the one method that predicts the reference "
                   "sizes of every setting best)",
           "family": "family-aware (the reference sizes extrapolated in log N to the target's N)",
           "nearest": "nearest single reference (the largest reference size)"}
PREDICTION_KEYS = ("mean_abs_error", "errors", "separation_sigma")
GOAL_MAE_AT = 0.3       # the predicted final losses' mean absolute error at this fraction...
GOAL_MAE = 0.01         # ...at most this
GOAL_REGRET_UPTO = 0.3  # predicted-best regret at most current-best regret at every fraction up to this


def load_sweep(workdir: str) -> dict:
    path = os.path.join(workdir, "sweep.json")
    if not os.path.isfile(path):
        raise SystemExit(f"{workdir}: no sweep.json; run the sweep there first (run.sh has the commands)")
    with open(path) as f:
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
            out["auto_methods"] = sorted({s["method_choice"][str(row["fraction"])]["method"]
                                          for s in sw["settings"]})
            for decision in (*METHODS, CURRENT_BEST):
                e = row[decision]
                chosen = e["chosen"][0]
                out[decision] = {"chosen": chosen, "ranking": e["ranking"], "regret": e["regret"],
                                 "regret_vs_seed_mean": float(mean_K[names.index(chosen)] - best_mean),
                                 "kendall_tau": e["kendall_tau"],
                                 "target_compute_fraction": e["target_compute_fraction"],
                                 "total_compute_fraction": e["total_compute_fraction"],
                                 "wall_fraction": wall_fraction(sw, row, decision),
                                 **{k: e[k] for k in PREDICTION_KEYS if k in e}}  # the current best predicts none
            rows.append(out)
        seeds.append({"workdir": workdir, "true_ranking": sw["true_ranking"], "per_fraction": rows,
                      "target_seconds": sum(s["seconds"] for s in sw["settings"]),
                      "reference_seconds": sw["reference_seconds"]})
    section = {"target": os.path.splitext(os.path.basename(sweeps[0]["model"]))[0],
               "reference_models": sweeps[0]["reference_models"],
               "settings": [{"name": s["name"], "tau": s["tau"], "weight_decay": s["weight_decay"],
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
    section["goals"] = goals(section)
    return section


def goals(sec: dict) -> dict:
    """The early-stopped sweep's goals, each as measured: met or missed (None where it cannot be judged)."""
    rows = [(i, row) for i, seed in enumerate(sec["seeds"]) for row in seed["per_fraction"]]
    at = [(i, row) for i, row in rows if abs(row["fraction"] - GOAL_MAE_AT) < 1e-9]
    mae = [row["auto"]["mean_abs_error"] for _, row in at]
    early = [(i, row) for i, row in rows if row["fraction"] <= GOAL_REGRET_UPTO + 1e-9]
    worse = [{"seed": i, "fraction": row["fraction"], "predicted_best": row["auto"]["regret"],
              "current_best": row[CURRENT_BEST]["regret"]}
             for i, row in early if row["auto"]["regret"] > row[CURRENT_BEST]["regret"]]
    out = {"mae_at": GOAL_MAE_AT, "mae_goal": GOAL_MAE, "mae": mae, "mae_met": bool(mae) and max(mae) <= GOAL_MAE,
           "regret_upto": GOAL_REGRET_UPTO, "regret_worse_than_current_best": worse,
           "regret_met": bool(early) and not worse, "winner_at": GOAL_MAE_AT, "winner_met": None}
    if "seed_noise" in sec:
        # The true winner within seed noise: a seed-mean final loss within 2 paired-noise deviations of the best.
        tolerance = 2 * sec["seed_noise"]["paired_noise"]
        picked = [row["auto"]["regret_vs_seed_mean"] for _, row in at]
        out.update(winner_tolerance=tolerance, winner_regret_vs_seed_mean=picked,
                   winner_met=bool(picked) and max(picked) <= tolerance)
    return out


def render_section(title: str, sec: dict) -> list[str]:
    n_seeds = len(sec["seeds"])
    lines = [f"## {title}", "", f"Workdirs: {', '.join('`' + s['workdir'] + '`' for s in sec['seeds'])}. "
             f"Early-align over t̂ in [{sec['align_start']:g}·f, f].", ""]
    best = min(s["final_loss_mean"] for s in sec["settings"])
    lines += markdown.table(
        ["setting", "τ", "batch (seqs)", f"λ ({sec['target']})", "final loss seed 0", *(f"seed {i}" for i in range(1, n_seeds)),
         "mean", "− best mean"],
        ([s["name"], f"{s['tau']:.3g}", s["batch_seqs"], f"{s['weight_decay']:.3g}", *(f"{x:.4f}" for x in s["final_loss_per_seed"]),
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
    lines += ["### Decisions at each stop fraction", "",
              "Predicted best: the lowest final loss predicted by the sweep's choice of method (in brackets). "
              "Current best: the lowest smoothed training loss so far. Oracle: every setting trained to the end. "
              "Regret against the best final loss of the same seed; compute saved: the share of the target "
              "training of all settings to the end not spent when every setting stops at the fraction and one "
              "trains on (with the reference runs the sweep trained counted in both, in brackets).", ""]
    lines += markdown.table(
        ["seed", "fraction", "predicted best", "regret", "current best", "regret", "oracle", "regret",
         "compute saved"],
        ([i, f"{row['fraction']:g}", f"{row['auto']['chosen']} ({', '.join(row['auto_methods'])})",
          f"{row['auto']['regret']:.4f}", row[CURRENT_BEST]["chosen"], f"{row[CURRENT_BEST]['regret']:.4f}",
          seed["true_ranking"][0], "0", f"{100 * (1 - row['auto']['target_compute_fraction']):.0f}% "
          f"({100 * (1 - row['auto']['total_compute_fraction']):.0f}%)"]
         for i, seed in enumerate(sec["seeds"]) for row in seed["per_fraction"]))
    g = sec["goals"]
    met = {True: "met", False: "missed", None: "not judged (one seed)"}
    lines += ["", "Goals, as measured:", "",
              f"- mean absolute error of the predicted final losses at t̂ = {g['mae_at']:g} ≤ "
              f"{100 * g['mae_goal']:g}%: **{met[g['mae_met']]}** ("
              + ", ".join(f"seed {i}: {100 * m:.2f}%" for i, m in enumerate(g["mae"])) + ");",
              f"- predicted-best regret ≤ current-best regret at every fraction ≤ {g['regret_upto']:g}: "
              f"**{met[g['regret_met']]}**"
              + ("" if not g["regret_worse_than_current_best"] else " (worse at " + ", ".join(
                  f"seed {w['seed']} @{w['fraction']:g}: {w['predicted_best']:.4f} > {w['current_best']:.4f}"
                  for w in g["regret_worse_than_current_best"]) + ")") + ";",
              f"- the true winner, within seed noise, picked at t̂ = {g['winner_at']:g}: **{met[g['winner_met']]}**"
              + ("" if g["winner_met"] is None else " (seed-mean regret of the pick: " + ", ".join(
                  f"{r:.4f}" for r in g["winner_regret_vs_seed_mean"])
                 + f"; tolerance 2 × paired noise = {g['winner_tolerance']:.4f})") + ".", ""]
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
    lines = ["# Early-stopped sweeps of tiny models in the short-run regime: measured results", "",
             f"Written by `experiments/early_stop_sweep/report.py` on {time.strftime('%Y-%m-%d %H:%M')} "
             f"({platform.machine()}, {os.cpu_count()} CPU cores) from the sweeps' `sweep.json`. Regret: true final "
             "loss of the predicted winner minus the best true final loss (of the same seed, or of the seed "
             "means). Target FLOPs: training every setting to the fraction and only the predicted winner to the "
             "end, as a share of training every setting to the end; \"with references\" adds the reference runs "
             "the sweep trained (not references it was given) to both; target wall time: the same share of the "
             "targets' measured seconds. Separation: gap between the first two predictions over their combined 1σ "
             "(residual noise only).", ""]
    for title, sec in sections.items():
        lines += render_section(title, sec)
    write_json_atomic(os.path.join(args.out, "results.json"), sections)
    write_text_atomic(os.path.join(args.out, "results.md"), "\n".join(lines))
    print(f"wrote {args.out}/results.md and {args.out}/results.json")


if __name__ == "__main__":
    main()
