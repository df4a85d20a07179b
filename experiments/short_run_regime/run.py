"""The short-run regime: does a normalized curve's shape follow tokens, steps or TPP, and from where on not?

    python experiments/short_run_regime/run.py            # train what is missing, then write the results
    python experiments/short_run_regime/run.py --report   # only rewrite results.md, results.json and regime.png

Every run is the demo's smallest shape (experiments/demo/sizes/d40-l2.gin) unless a cell says otherwise, with
the demo's eval curve (experiments/demo/eval.gin: the same 128 held-out sequences at 50 points of t̂), the demo's
base LR and one AdamW timescale τ for every cell, so that only tokens D, batch B (hence steps T = D/B) and
parameters N move. Cells:

- `tokens`: D from 2 to 32 TPP at a batch of 16 sequences (steps grow with D);
- `batch`: D fixed at 8 TPP, batch 4 to 64 sequences (steps fall as tokens stay);
- `steps`: about 660 steps at 2, 8 and 32 TPP, and 2,650 steps at 2, 4, 8 and 32 TPP (batch grows with D);
- `params`: D fixed at the d40-l2 8-TPP budget, and sizes d56-l3 and d80-l5 (TPP falls as N grows), at 660 and
  2,650 steps;
- `long`: 16 TPP at a batch of 4 (5,300 steps), where the curve has stopped moving;
- `lr`: at 8 TPP, the batch of 32 at twice the LR and the batches of 16 and 8 at half of it (τ held, so λ moves
  against the LR): does the shape follow the LR summed over training rather than the steps?
- `beta2`, `noclip`: the step-scaled candidates at 166 and 1,324 steps: β2 from a half-life of 2% of t̂ instead
  of β2 = 0.95, and gradient clipping off.

Runs live in --workdir (default runs/short_run_regime/<cell>/<run>-seed<k>); rerunning skips finished runs.
The analysis is `analysis.py` beside this file.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.dirname(HERE)
sys.path.insert(0, HERE)

SEEDS = (0, 1)
TAU = 0.35  # the law 0.78·TPP^-0.5 at 5 TPP, held for every cell
SIZE_FILES = {s: os.path.join(EXPERIMENTS, "demo", "sizes", f"{s}.gin") for s in ("d40-l2", "d56-l3", "d80-l5")}
EVAL_SEQS = 128  # eval.gin's 128 held-out sequences, the same ones at every batch
BASE_LR = 1.2e-2  # experiments/tiny/base.gin
PARAMS_TOKENS_TPP = 8.0  # the `params` cell's budget: the d40-l2 run at this TPP


def cells() -> dict[str, tuple[str, float, int, tuple[str, ...]]]:
    """Run name (`<cell>/<label>`) -> (size, TPP, batch in sequences, extra gin bindings)."""
    out = {}
    for tpp in (2, 4, 8, 16, 32):
        out[f"tokens/tpp{tpp}-b16"] = ("d40-l2", tpp, 16, ())
    for b in (4, 8, 32, 64):
        out[f"batch/tpp8-b{b}"] = ("d40-l2", 8, b, ())
    out["steps/tpp2-b4"] = ("d40-l2", 2, 4, ())
    out["steps/tpp32-b64"] = ("d40-l2", 32, 64, ())
    out["long/tpp16-b4"] = ("d40-l2", 16, 4, ())
    for tpp, b in ((2, 1), (4, 2)):
        out[f"steps/tpp{tpp}-b{b}"] = ("d40-l2", tpp, b, ())
    for size in ("d56-l3", "d80-l5"):
        out[f"params/{size}-b16"] = (size, None, 16, ())
        out[f"params/{size}-b4"] = (size, None, 4, ())
    for b, lr in ((32, 2.0), (16, 0.5), (8, 0.5)):
        out[f"lr/tpp8-b{b}-lr{lr:g}"] = ("d40-l2", 8, b, (f"RecipeConfig.base_lr = {BASE_LR * lr!r}",))
    for tpp in (2, 16):
        out[f"beta2/tpp{tpp}-b16"] = ("d40-l2", tpp, 16, ("RecipeConfig.adam_b2_half_life = 0.02",))
        out[f"noclip/tpp{tpp}-b16"] = ("d40-l2", tpp, 16, ("RecipeConfig.grad_clip = 0.0",))
    return out


def run_spec(workdir: str, name: str, seed: int):
    from celerity_jax import gin_config, run
    from celerity_jax.model import params

    size, tpp, batch, extra = cells()[name]
    files = (SIZE_FILES[size], os.path.join(EXPERIMENTS, "demo", "tau.gin"), os.path.join(EXPERIMENTS, "demo", "eval.gin"))
    if tpp is None:  # the d40-l2 budget at PARAMS_TOKENS_TPP
        n_small = params.count_params(gin_config.parse_gin((SIZE_FILES["d40-l2"],) + files[1:]).model)
        n = params.count_params(gin_config.parse_gin(files).model)
        tpp = PARAMS_TOKENS_TPP * n_small / n
    bindings = (f"RecipeConfig.tpp = {float(tpp)!r}", f"RecipeConfig.tau = {TAU!r}",
                f"RecipeConfig.batch_seqs = {batch}", f"TrainConfig.eval_batches = {EVAL_SEQS // batch}",
                f"TrainConfig.seed = {seed}") + extra
    label = f"{name}-seed{seed}"
    return run.RunSpec(os.path.join(workdir, *label.split("/")), files, bindings, name=label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/short_run_regime")
    parser.add_argument("--report", action="store_true", help="only write the results from the runs there")
    parser.add_argument("--cells", default="", help="comma-separated cell names to train (default: all)")
    args = parser.parse_args()
    if not args.report:
        import jax

        from celerity_jax import run

        jax.config.update("jax_compilation_cache_dir", os.path.join(args.workdir, "jax_cache"))
        wanted = set(filter(None, args.cells.split(",")))
        run.train_all(run_spec(args.workdir, name, seed) for seed in SEEDS for name in cells()
                      if not wanted or name.split("/")[0] in wanted)
    import analysis

    analysis.write_results(args.workdir)


if __name__ == "__main__":
    main()
