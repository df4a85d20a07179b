"""Trains the evaluation families of the final-loss predictor: widths × two seeds at one TPP and τ.

Each run is the demo's tau recipe (experiments/demo/tau.gin: one batch of 8 × 64 tokens, τ from the law; eval
curves from eval.gin) at --tpp, seeds 0 and 1 of each size distinct; rerunning skips finished runs. A run shorter
than the short-run regime (collapse/regime.py) is trained all the same, with a warning line. Measure with
`python benchmarks/collapse_predictor.py WORKDIR/*/* --leave-one-out`.

    python experiments/predictor/train_family.py --workdir runs/predictor/tpp5 --tpp 5 --sizes d64,d80,d96,d112
"""

import argparse
import os

from celerity_jax import run
from celerity_jax.collapse import regime

SIZES = ("d48", "d64", "d80", "d96", "d112")
SEEDS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--tpp", type=float, default=5.0)
    parser.add_argument("--sizes", default=",".join(SIZES))
    args = parser.parse_args()
    exp = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sizes = args.sizes.split(",")
    for seed in range(SEEDS):
        for i, size in enumerate(sizes):
            files = (os.path.join(exp, "tiny", f"{size}.gin"), os.path.join(exp, "demo", "tau.gin"),
                     os.path.join(exp, "demo", "eval.gin"))
            params = (f"RecipeConfig.tpp = {args.tpp!r}", f"TrainConfig.seed = {seed * len(sizes) + i}")
            name = f"{size}/seed{seed}"
            loaded = run.load(run.RunSpec(os.path.join(args.workdir, name), files, params, name=name))
            short = regime.outside(loaded.plan.steps, loaded.plan.tokens)
            if short:
                print(f"warning: {name}: {short}", flush=True)
            loaded.train_to(log=lambda *a, **k: None)
            print(f"{name}: {loaded.train_seconds():.0f} s", flush=True)


if __name__ == "__main__":
    main()
