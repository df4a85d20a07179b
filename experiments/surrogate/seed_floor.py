"""The seed floor of the surrogate's error: a second seed of one size's grid runs, against the first.

    python experiments/surrogate/seed_floor.py [--sizes d64] [--seed 1] [run.py's curve options]

Trains the grid of --sizes again with TrainConfig.seed = --seed (as run.py trains, into run.py's workdir with
`_seed<seed>` appended), then, per (τ, TPP) and over t̂ ∈ [0.2, 1] of the normalized curves:
- seeds: the MAE between the two seeds' curves. If the seeds scatter independently around a mean curve, a
  predictor that knew that mean exactly would still be off by about this / sqrt(2) on one seed: the floor of
  any surrogate scored on single-seed runs, as run.py scores it;
- surrogate: the MAE of the surrogate fitted on all of run.py's runs (the constants in its results.json) on
  the new seed's curve, a run it has never seen.
Writes seed_floor.json beside run.py's results.
"""

import argparse
import json
import os
import sys

import numpy as np

from celerity_jax.collapse import files, surrogate
from celerity_jax.fileio import write_json_atomic
from run import FIT_RANGE, grid_runs, parse_args, train_grid  # run.py beside this file


def main() -> int:
    own = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False,
                                  epilog="Other options are run.py's (its grid, curve and bins options).")
    own.add_argument("--sizes", default="d64", help="the sizes trained again (default d64)")
    own.add_argument("--seed", type=int, default=1, help="their second seed (default 1)")
    known, rest = own.parse_known_args(sys.argv[1:])
    args = parse_args(["--sizes", known.sizes, *rest])  # the first seed's grid, curve and bins options
    seed_args = parse_args(["--sizes", known.sizes, "--seed", str(known.seed),
                            "--workdir", f"{args.workdir}_seed{known.seed}", *rest])
    if known.seed == 0:
        own.error("--seed must differ from run.py's seed 0")
    train_grid(grid_runs(seed_args), seed_args.workdir, seed_args.force_new)

    with open(os.path.join(args.out, "results.json")) as f:
        constants = surrogate.SurrogateConstants(**json.load(f)["constants"])
    first = [files.load_curve(os.path.join(args.workdir, r.name), loss=args.loss_curve) for r in grid_runs(args)]
    second = [files.load_curve(os.path.join(seed_args.workdir, r.name), loss=args.loss_curve)
              for r in grid_runs(seed_args)]
    a, b = (surrogate.surrogate_inputs(runs, args.bins, args.smooth_bins) for runs in (first, second))
    keep_G = (a.frac_G >= FIT_RANGE[0]) & (a.frac_G <= FIT_RANGE[1])
    seeds_C = np.mean(np.abs(a.curves_CxG - b.curves_CxG)[:, keep_G], axis=1)
    surrogate_C = surrogate.mae_per_curve(constants, *b.arrays(), *FIT_RANGE)
    rows = [{"run": r.name, "seeds_mae": float(s), "surrogate_mae_new_seed": float(m)}
            for r, s, m in zip(grid_runs(args), seeds_C, surrogate_C)]
    print(f"{args.loss_curve}-loss curves, seeds 0 and {known.seed}; MAE over t̂ in {list(FIT_RANGE)}")
    print(f"{'run':22s} {'seed vs seed':>13s} {'surrogate, new seed':>20s}")
    for row in rows:
        print(f"{row['run']:22s} {100 * row['seeds_mae']:12.2f}% {100 * row['surrogate_mae_new_seed']:19.2f}%")
    summary = {"seeds_mae": float(seeds_C.mean()), "floor_one_seed": float(seeds_C.mean() / np.sqrt(2)),
               "surrogate_mae_new_seed": float(surrogate_C.mean())}
    print(f"{'mean':22s} {100 * summary['seeds_mae']:12.2f}% {100 * summary['surrogate_mae_new_seed']:19.2f}%"
          f"   (floor for one-seed runs ≈ {100 * summary['floor_one_seed']:.2f}%)")
    out = os.path.join(args.out, "seed_floor.json")
    write_json_atomic(out, {"loss_curve": args.loss_curve, "sizes": known.sizes, "seed": known.seed,
                            "fit_range": list(FIT_RANGE), "summary": summary, "runs": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
