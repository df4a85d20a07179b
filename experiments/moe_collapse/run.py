"""Mixture-of-experts collapse: do hash-routed MoE curves shift with the tokens per expert, TPP/E?

    python experiments/moe_collapse/run.py            # train what is missing, then write the results
    python experiments/moe_collapse/run.py --report   # only rewrite results.md, results.json and moe_collapse.png

Under hash routing each of E experts sees 1/E of the tokens, so the AdamW timescale τ = B/(ηλD) is the same for
every E while an expert's tokens per parameter fall as TPP/E. Every run here is the demo's d40-l2 shape with the
demo's eval curve and base LR and one τ; two arms:

- `moe/e<E>`: E ∈ {1, 2, 4, 8} hash-routed experts (capacity_factor None: no token is dropped), all at TPP_MOE
  tokens per parameter counting every expert (as the planner does), at a batch of 16 sequences; E = 1 is the
  dense model;
- `dense/tpp<T>`: the dense d40-l2 at T = TPP_MOE/E for E ∈ {2, 4, 8}, each at 1,324 steps (the batch falls
  with T).

Every MoE run is past both short-run thresholds (1,300 steps and 650,000 tokens; docs/science.md). The dense runs
at 4 and 2 TPP (339k and 170k tokens) are below the token threshold: at this scale a dense run at TPP/8 in the
regime would need 64 TPP, and its E = 8 partner 28M tokens, beyond this experiment's CPU budget. Runs live in --workdir (default runs/moe_collapse/<arm>/<run>-seed<k>);
rerunning skips finished runs. The measures and the figure are `analysis.py` beside this file.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.dirname(HERE)
sys.path.insert(0, HERE)

SEEDS = (0, 1, 2, 3, 4)
EXPERTS = (1, 2, 4, 8)
TPP_MOE = 16.0
TAU = 0.35  # the short-run regime study's τ
EVAL_SEQS = 128  # the demo's 128 held-out sequences, the same ones at every batch
MOE_BATCH = 16  # 1,324 steps at E = 1, more at larger E (more parameters, so more tokens)
DENSE_BATCH = {8: 8, 4: 4, 2: 2}  # 1,324 steps each
GIN_FILES = tuple(os.path.join(EXPERIMENTS, "demo", f) for f in ("sizes/d40-l2.gin", "tau.gin", "eval.gin"))


def cells() -> dict[str, tuple[int, float, int]]:
    """Run name (`<arm>/<label>`) -> (experts E, TPP, batch in sequences)."""
    out = {f"moe/e{e}": (e, TPP_MOE, MOE_BATCH) for e in EXPERTS}
    for e in EXPERTS[1:]:
        tpp = TPP_MOE / e
        out[f"dense/tpp{tpp:g}"] = (1, tpp, DENSE_BATCH[int(tpp)])
    return out


def run_spec(workdir: str, name: str, seed: int):
    from celerity_jax import run

    experts, tpp, batch = cells()[name]
    bindings = (f"RecipeConfig.tpp = {tpp!r}", f"RecipeConfig.tau = {TAU!r}", f"RecipeConfig.batch_seqs = {batch}",
                f"TrainConfig.eval_batches = {EVAL_SEQS // batch}", f"TrainConfig.seed = {seed}")
    if experts > 1:
        bindings += (f"ModelConfig.n_experts = {experts}", "ModelConfig.router = 'hash'",
                     "ModelConfig.capacity_factor = None")
    label = f"{name}-seed{seed}"
    return run.RunSpec(os.path.join(workdir, *label.split("/")), GIN_FILES, bindings, name=label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/moe_collapse")
    parser.add_argument("--report", action="store_true", help="only write the results from the runs there")
    parser.add_argument("--runs", default="", help="comma-separated run names to train (default: all)")
    args = parser.parse_args()
    if not args.report:
        import jax

        from celerity_jax import run

        jax.config.update("jax_compilation_cache_dir", os.path.join(args.workdir, "jax_cache"))
        wanted = set(filter(None, args.runs.split(",")))
        run.train_all(run_spec(args.workdir, name, seed) for seed in SEEDS for name in cells()
                      if not wanted or name in wanted)
    import analysis

    analysis.write_results(args.workdir)


if __name__ == "__main__":
    main()
