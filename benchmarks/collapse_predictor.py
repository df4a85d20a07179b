"""Final-loss prediction from partial curves: single-reference vs family-aware early-align.

For every size with at least two smaller sizes among the CURVEs (run directories or CSVs with sidecars,
N known), references are built from each smaller size (seeds averaged); each run of the target size is
cut at several fractions of training, aligned over t̂ in [f/2, f], and its predicted final loss is
compared with its real (smoothed) final loss: once against the nearest smaller size alone, once against
the family-aware curve extrapolated to its N. With `--leave-one-out` every size is a target in turn and
the references are all the other sizes (the nearest in log N alone, or the family-aware curve at its N).
`--synthetic` writes a drifting surrogate family first; `--by-tpp` evaluates each TPP's family of the CURVEs
(e.g. the OLMo ladder's token budgets); `--loss-curve train,eval` evaluates each on both curves. Every table
ends with the goal (family-aware error ≤ 0.5× the single-reference error at 10–30% of training), met or
missed, with the ratios. Every cell also scores "chosen": the method predictor.choose_method picks at that
fraction from the target's references alone (never the target), with `chosen_vs_plain`, its error over the
single-reference error, and the chosen method's goals (`goal_chosen`): never worse than plain within 2 standard
errors of the paired difference in any cell, and ≤ 0.5× plain at 10–30% on families of 4 sizes or more. Variants tried against the goal: `--window-start a` aligns over [a·f, f] instead;
`--shrunk` also scores the predictor's "shrunk" method, the family-aware curve with each t̂'s slope in log N shrunk
toward 0 by its signal-to-noise (needs 3 or more reference sizes); `--exact-frac` also scores both predictors with
each point of the window aligned at its own t̂ (`predict_exact`).

    python benchmarks/collapse_predictor.py runs/d48 runs/d64 runs/d80 ... [--out bench_out/collapse_predictor.json]
    python benchmarks/collapse_predictor.py benchmarks/data/cpu-families/tpp5/*/* --leave-one-out \
        --loss-curve train,eval
    python benchmarks/collapse_predictor.py --synthetic
    python benchmarks/collapse_predictor.py benchmarks/data/olmo-ladder/*.csv --by-tpp --leave-one-out \
        --bins 50 --smooth-bins 3
"""

import argparse
import dataclasses
import json
import os
import tempfile

import jax
import numpy as np

from celerity_jax.collapse import curves, files, predictor, reference, surrogate
from celerity_jax.collapse.types import Curve
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic
from celerity_jax.rundir import LOSS_CSV


def write_synthetic_family(directory: str, seeds: int = 2, steps: int = 3000) -> list[str]:
    """CSV curves of a family whose normalized curve drifts with N (b ∝ N^0.15), 1% per-step noise."""
    paths = []
    for i, n in enumerate((1e5, 2e5, 4e5, 8e5, 1.6e6)):
        for seed in range(seeds):
            _, loss_T = surrogate.sample_curve(jax.random.key(100 * i + seed), steps, 0.1 * (n / 1e5)**0.15, 1.0,
                                               4.0 * (n / 1e5)**-0.1, 0.01)
            path = os.path.join(directory, f"n{int(n)}_seed{seed}.csv")
            with open(path, "w") as f:
                f.write("step,loss\n" + "".join(f"{s},{v!r}\n" for s, v in
                                                 zip(range(1, steps + 1), np.asarray(loss_T).tolist())))
            with open(path[:-4] + ".json", "w") as f:
                json.dump({"n_params": n, "tpp": 20, "tau": 0.17, "schedule": "d2z", "warmup_frac": 0.1}, f)
            paths.append(path)
    return paths


def predict_exact(run: Curve, ref_G: np.ndarray, upto: float, align_start: float = 0.5) -> float:
    """predictor.predict's alignment (its window, its points) with each point at its own t̂ instead of its bin's
    centre: log L̂_T = mean over the window's points of log L_t − log l_ref(t̂_t), l_ref interpolated linearly
    between bin centres. The points are those of the bins predictor.predict aligns over."""
    n_bins = len(ref_G)
    lo, hi = predictor.window_at(upto, None, align_start)
    centre_T = curves.bin_centers(n_bins)[np.asarray(curves.bin_index(run.frac_T, n_bins))]
    keep_T = (run.frac_T <= upto + 1e-9) & (centre_T >= lo) & (centre_T < hi) & np.isfinite(run.loss_T)
    ref_T = np.interp(run.frac_T[keep_T], curves.bin_centers(n_bins), np.asarray(ref_G, np.float64))
    return float(np.exp(np.mean(np.log(run.loss_T[keep_T]) - np.log(ref_T))))


def evaluate(paths: list[str], fracs: list[float], n_bins: int, smooth_bins: int, force: bool,
             leave_one_out: bool = False, loss: str = "train", window_start: float = 0.5,
             shrunk: bool = False, exact_frac: bool = False) -> dict:
    runs = [files.load_curve(p, loss=loss) for p in paths]
    by_size: dict[float, list[Curve]] = {}
    for run in runs:
        if run.controls.n_params is None:
            raise ConfigError(f"{run.source}: N unknown; give run directories or CSV sidecars with n_params")
        if not run.finished:
            raise ConfigError(f"{run.source}: the benchmark needs finished runs (their final loss is the truth)")
        problems = run.controls.mismatches(runs[0].controls)
        if problems and not force:
            raise ConfigError(f"{run.source}: controls differ from {runs[0].source} ({', '.join(problems)}); "
                              "a family shares TPP, τ and schedule. Pass --force to mix them")
        by_size.setdefault(run.controls.n_params, []).append(run)
    sizes = sorted(by_size)
    refs = {n: reference.reference_from_curves(by_size[n], n_bins, smooth_bins, force=force) for n in sizes}
    frac_G = curves.bin_centers(n_bins)
    rows, choices = [], []
    for i, target in enumerate(sizes):
        others = [refs[n] for n in sizes if n != target] if leave_one_out else [refs[n] for n in sizes[:i]]
        if len(others) < 2:
            continue
        candidates = {"single": predictor.reference_for(others, frac_G, target, "nearest"),
                      "family": predictor.reference_for(others, frac_G, target, "family")}
        if shrunk and len(others) > 2:
            candidates["family_shrunk"] = predictor.reference_for(others, frac_G, target, "shrunk")
        chosen = {f: predictor.choose_method(others, frac_G, f, align_start=window_start) for f in fracs}
        choices += [{"n_params": target, "frac": f, **dataclasses.asdict(c)} for f, c in chosen.items()]
        chosen_G = {f: predictor.reference_for(others, frac_G, target, c.method) for f, c in chosen.items()}
        for run in by_size[target]:
            sum_G, count_G = curves.bin_curve(run.frac_T, run.loss_T, n_bins)
            true_final = float(curves.smooth(sum_G, count_G, smooth_bins)[0][-1])
            for f in fracs:
                row = {"curve": run.source, "n_params": target, "references": len(others), "frac": f}
                for name, ref_G in {**candidates, "chosen": chosen_G[f]}.items():
                    pred = predictor.predict(run, ref_G, upto=f, align_start=window_start)
                    row[f"{name}_error"] = pred.final / true_final - 1.0
                row["chosen_method"] = chosen[f].method
                if exact_frac:
                    for name in ("single", "family"):
                        pred = predict_exact(run, candidates[name], f, window_start)
                        row[f"{name}_exact_error"] = pred / true_final - 1.0
                rows.append(row)
    if not rows:
        raise ConfigError(f"{len(sizes)} size(s) given; the benchmark needs at least 3 (two as references)")
    # family_shrunk is scored only on targets with 3 or more references: its ratio is over those same targets
    names = [n for n in ("single", "family", "family_shrunk", "single_exact", "family_exact", "chosen")
             if any(f"{n}_error" in r for r in rows)]
    summary = {}
    for f in fracs:
        summary[f] = {name: float(np.mean([abs(r[f"{name}_error"]) for r in rows
                                           if r["frac"] == f and f"{name}_error" in r])) for name in names}
        summary[f]["chosen_vs_plain"] = summary[f]["chosen"] / summary[f]["single"]
        # the seed noise of that comparison: the standard error of the paired difference of |error| over targets
        diff_R = [abs(r["chosen_error"]) - abs(r["single_error"]) for r in rows if r["frac"] == f]
        summary[f]["chosen_minus_plain_se"] = float(np.std(diff_R, ddof=1) / np.sqrt(len(diff_R))) \
            if len(diff_R) > 1 else float("nan")
        for name in names:
            if name.startswith("single") or name == "chosen":
                continue
            base = "single_exact" if name.endswith("_exact") else "single"
            scored = [r for r in rows if r["frac"] == f and f"{name}_error" in r]
            summary[f][f"{name}_over_{base}"] = summary[f][name] / float(np.mean([abs(r[f"{base}_error"])
                                                                                for r in scored]))
    return {"rows": rows, "mean_abs_error": summary, "choices": choices, "sizes": sizes, "n_bins": n_bins,
            "smooth_bins": smooth_bins,
            "leave_one_out": leave_one_out, "loss_curve": loss, "window_start": window_start,
            "exact_frac": exact_frac}


GOAL_RATIO = 0.5            # family-aware error ≤ 0.5× single-reference error ...
GOAL_FRACS = (0.1, 0.3)     # ... at every seen fraction in this range


def goal(summary: dict, ratio: str = "family_over_single") -> dict:
    """Whether the family-aware error is at most GOAL_RATIO× the single-reference error (`ratio`) at every
    fraction of GOAL_FRACS that was measured, with those ratios."""
    ratios = {f: e[ratio] for f, e in summary.items() if GOAL_FRACS[0] <= f <= GOAL_FRACS[1]}
    return {"met": bool(ratios) and all(r <= GOAL_RATIO for r in ratios.values()), "ratios": ratios}


CHOSEN_NOISE_SE = 2.0  # "never worse than plain": chosen − plain mean |error| within this many standard errors


def goal_chosen(summary: dict, sizes: int) -> dict:
    """The chosen method's goals: never worse than plain alignment in any cell (its excess mean |error| within
    CHOSEN_NOISE_SE standard errors of the paired difference), and, on families of 4 sizes or more, at most
    GOAL_RATIO× plain at every fraction of GOAL_FRACS; with the ratios."""
    ratios = {f: e["chosen_vs_plain"] for f, e in summary.items()}
    never_worse = all(e["chosen"] - e["single"] <= CHOSEN_NOISE_SE * np.nan_to_num(e["chosen_minus_plain_se"])
                      for e in summary.values())
    halved = {f: r for f, r in ratios.items() if GOAL_FRACS[0] <= f <= GOAL_FRACS[1]}
    return {"never_worse_met": bool(never_worse), "halved_met": (all(r <= GOAL_RATIO for r in halved.values())
                                                                  if sizes >= 4 else None), "ratios": ratios}


def print_table(title: str, result: dict, window_start: float) -> None:
    print(f"{title}: {len(result['sizes'])} sizes, {len({r['curve'] for r in result['rows']})} target runs; "
          f"mean |predicted / real final loss - 1|, aligned over t̂ in [{window_start:g}·f, f]")
    columns = next(iter(result["mean_abs_error"].values()))
    ratios = [n for n in columns if "_over_" in n or n == "chosen_vs_plain"]
    names = [n for n in columns if n not in ratios]
    print(f"{'seen f':>7s} " + " ".join(f"{n:>14s}" for n in names) + " "
          + " ".join(f"{n.replace('_over_', '/').replace('_vs_plain', '/single'):>{max(21, len(n) - 4)}s}"
                     for n in ratios))
    for f, errors in result["mean_abs_error"].items():
        print(f"{f:7.2f} " + " ".join(f"{100 * errors[n]:13.3f}%" for n in names) + " "
              + " ".join(f"{errors[n]:{max(20, len(n) - 5)}.2f}x" for n in ratios))
    chosen: dict[float, list[str]] = {}
    for choice in result["choices"]:
        chosen.setdefault(choice["frac"], []).append(choice["method"])
    print("chosen (targets by method): " + "; ".join(
        f"{f:g} " + ", ".join(f"{m} {methods.count(m)}" for m in dict.fromkeys(methods))
        for f, methods in chosen.items()))
    g = result["goal_chosen"]
    print(f"goal chosen never worse than single (within {CHOSEN_NOISE_SE:g} SE): "
          f"{'MET' if g['never_worse_met'] else 'MISSED'}; chosen <= {GOAL_RATIO:g}x single at t̂ "
          f"{GOAL_FRACS[0]:g}-{GOAL_FRACS[1]:g}: "
          + ("not scored (fewer than 4 sizes)" if g["halved_met"] is None else "MET" if g["halved_met"] else "MISSED")
          + " (" + ", ".join(f"{f:g}: {r:.2f}x" for f, r in g["ratios"].items()) + ")")
    for key, label in (("goal", "family"), ("goal_exact", "family_exact")):
        if key in result:
            g = result[key]
            print(f"goal {label} <= {GOAL_RATIO:g}x single at t̂ {GOAL_FRACS[0]:g}-{GOAL_FRACS[1]:g}: "
                  f"{'MET' if g['met'] else 'MISSED'} ("
                  + ", ".join(f"{f:g}: {r:.2f}x" for f, r in g["ratios"].items()) + ")")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curves", nargs="*", metavar="CURVE")
    parser.add_argument("--synthetic", action="store_true", help="benchmark on a generated drifting family")
    parser.add_argument("--by-tpp", action="store_true",
                        help="the CURVEs hold several families, one per TPP (e.g. a ladder of token budgets): "
                             "evaluate each")
    parser.add_argument("--fracs", default="0.1,0.2,0.3,0.5")
    parser.add_argument("--bins", type=int, default=200)
    parser.add_argument("--smooth-bins", type=int, default=11)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--leave-one-out", action="store_true", help="every size a target, the others references")
    parser.add_argument("--loss-curve", default="train",
                        help=f"the loss curve(s) to predict, comma-separated: {', '.join(LOSS_CSV)}")
    parser.add_argument("--window-start", type=float, default=0.5, help="align over [a·f, f] (default a = 0.5)")
    parser.add_argument("--shrunk", action="store_true", help="also score the shrunk family-aware curve")
    parser.add_argument("--exact-frac", action="store_true",
                        help="also score both predictors with each point aligned at its own t̂, not its bin's centre")
    parser.add_argument("--out", default="bench_out/collapse_predictor.json")
    args = parser.parse_args()
    fracs = [float(f) for f in args.fracs.split(",")]
    losses = args.loss_curve.split(",")
    if any(loss not in LOSS_CSV for loss in losses):
        parser.error(f"--loss-curve {args.loss_curve!r}: give {' or '.join(LOSS_CSV)}, or both comma-separated")
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_synthetic_family(tmp) if args.synthetic else args.curves
        if not paths:
            parser.error("give CURVEs or --synthetic")
        families = {"family": paths}
        if args.by_tpp:
            by_tpp: dict[float, list[str]] = {}
            for path in paths:
                by_tpp.setdefault(files.load_curve(path).controls.tpp, []).append(path)
            families = {f"TPP {tpp:g}": by_tpp[tpp] for tpp in sorted(by_tpp)}
        results = {}
        for family_name, family in families.items():
            for loss in losses:
                name = family_name if len(losses) == 1 else f"{family_name}, {loss} curve"
                results[name] = evaluate(family, fracs, args.bins, args.smooth_bins, args.force, args.leave_one_out,
                                         loss, args.window_start, args.shrunk, args.exact_frac)
                results[name]["goal"] = goal(results[name]["mean_abs_error"])
                results[name]["goal_chosen"] = goal_chosen(results[name]["mean_abs_error"],
                                                           len(results[name]["sizes"]))
                if args.exact_frac:
                    results[name]["goal_exact"] = goal(results[name]["mean_abs_error"],
                                                       "family_exact_over_single_exact")
    for name, result in results.items():
        print_table(name, result, args.window_start)
    out = {"source": "synthetic drifting family" if args.synthetic else args.curves, "families": results}
    if len(results) > 1:
        out["goal_met_in"] = [name for name, r in results.items() if r["goal"]["met"]]
        print(f"goal met in {len(out['goal_met_in'])} of {len(results)} "
              + ("families" if len(losses) == 1 else "tables (family, loss curve)"))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json_atomic(args.out, out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
