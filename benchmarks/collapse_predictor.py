"""Final-loss prediction from partial curves: single-reference vs family-aware early-align.

For every size with at least two smaller sizes among the CURVEs (run directories or CSVs with sidecars,
N known), references are built from each smaller size (seeds averaged); each run of the target size is
cut at several fractions of training, aligned over t̂ in [f/2, f], and its predicted final loss is
compared with its real (smoothed) final loss: once against the nearest smaller size alone, once against
the family-aware curve extrapolated to its N. With `--leave-one-out` every size is a target in turn and
the references are all the other sizes (the nearest in log N alone, or the family-aware curve at its N).
`--synthetic` writes a drifting surrogate family first.

    python benchmarks/collapse_predictor.py runs/d48 runs/d64 runs/d80 ... [--out bench_out/collapse_predictor.json]
    python benchmarks/collapse_predictor.py runs/predictor/tpp5/*/* --leave-one-out
    python benchmarks/collapse_predictor.py --synthetic
"""

import argparse
import json
import math
import os
import tempfile

import jax
import numpy as np

from celerity_jax.collapse import curves, files, reference, surrogate
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic
from celerity_jax.train.rundir import LOSS_CSV


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


def evaluate(paths: list[str], fracs: list[float], n_bins: int, smooth_bins: int, force: bool,
             leave_one_out: bool = False, loss: str = "train") -> dict:
    runs = [files.load_curve(p, loss=loss) for p in paths]
    by_size: dict[float, list[files.Curve]] = {}
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
    rows = []
    for i, target in enumerate(sizes):
        others = [refs[n] for n in sizes if n != target] if leave_one_out else [refs[n] for n in sizes[:i]]
        if len(others) < 2:
            continue
        nearest = min(others, key=lambda r: abs(math.log(r.controls.n_params / target)))
        candidates = {"single": reference.reference_curve([nearest], frac_G),
                      "family": reference.reference_curve(others, frac_G, target)}
        for run in by_size[target]:
            sum_G, count_G = curves.bin_curve(run.frac_T, run.loss_T, n_bins)
            true_final = float(curves.smooth(sum_G, count_G, smooth_bins)[0][-1])
            for f in fracs:
                partial = curves.bin_curve(run.frac_T[run.frac_T <= f], run.loss_T[run.frac_T <= f], n_bins)
                row = {"curve": run.source, "n_params": target, "references": len(others), "frac": f}
                for name, ref_G in candidates.items():
                    pred = float(curves.early_align(*partial, ref_G, (f / 2, f)).final)
                    row[f"{name}_error"] = pred / true_final - 1.0
                rows.append(row)
    if not rows:
        raise ConfigError(f"{len(sizes)} size(s) given; the benchmark needs at least 3 (two as references)")
    summary = {f: {name: float(np.mean([abs(r[f"{name}_error"]) for r in rows if r["frac"] == f]))
                   for name in ("single", "family")} for f in fracs}
    for errors in summary.values():
        errors["family_over_single"] = errors["family"] / errors["single"]
    return {"rows": rows, "mean_abs_error": summary, "sizes": sizes, "n_bins": n_bins, "smooth_bins": smooth_bins,
            "leave_one_out": leave_one_out, "loss_curve": loss}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curves", nargs="*", metavar="CURVE")
    parser.add_argument("--synthetic", action="store_true", help="benchmark on a generated drifting family")
    parser.add_argument("--fracs", default="0.1,0.2,0.3,0.5")
    parser.add_argument("--bins", type=int, default=200)
    parser.add_argument("--smooth-bins", type=int, default=11)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--leave-one-out", action="store_true", help="every size a target, the others references")
    parser.add_argument("--loss-curve", choices=tuple(LOSS_CSV), default="train")
    parser.add_argument("--out", default="bench_out/collapse_predictor.json")
    args = parser.parse_args()
    fracs = [float(f) for f in args.fracs.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_synthetic_family(tmp) if args.synthetic else args.curves
        if not paths:
            parser.error("give CURVEs or --synthetic")
        result = evaluate(paths, fracs, args.bins, args.smooth_bins, args.force, args.leave_one_out, args.loss_curve)
    result["source"] = "synthetic drifting family" if args.synthetic else args.curves
    print(f"{len(result['sizes'])} sizes, {len(result['rows']) // len(fracs)} target runs; "
          "mean |predicted / real final loss - 1|, aligned over t̂ in [f/2, f]")
    print(f"{'seen f':>7s} {'single ref':>11s} {'family':>9s} {'family/single':>14s}")
    for f, errors in result["mean_abs_error"].items():
        print(f"{f:7.2f} {100 * errors['single']:10.3f}% {100 * errors['family']:8.3f}% "
              f"{errors['family_over_single']:13.2f}x")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json_atomic(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
