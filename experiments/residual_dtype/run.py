"""What a bfloat16 residual stream does to a tiny family's curves, against seed noise.

    python experiments/residual_dtype/run.py            # train what is missing, then write the results
    python experiments/residual_dtype/run.py --report   # only rewrite results.md and results.json

The float32 runs are the predictor's TPP 10 family (benchmarks/data/cpu-families/tpp10: the demo's τ recipe,
d48, d64 and d80, seeds 0 and 1). This trains the same runs, same seeds, with ModelConfig.residual_dtype =
'bfloat16' (matmuls stay float32, as on CPU; only the residual stream is rounded), and d48 seed 0 once more in
float32, to check that today's code reproduces the stored curve. The family's models have 2 layers, the base
depth, so CompleteP's residual multiplier is 1 there; the deep cell (d48 at 8 layers, multiplier 1/4, each
block's increment four times smaller against the stream it is added to) trains both dtypes, same two seeds.
Per size and seed it compares, over t̂ ∈ [0.2, 1], the normalized training curve (binned and smoothed as the monitor does) and the final smoothed
train and eval losses with the float32 run of the same seed, against the difference between the two float32
seeds of that size; and for each family, how its normalized curves collapse (`curves.family_measures`: the
spread across sizes Δ against seed noise σ, the trend with N, the paper's MAE).
"""

import argparse
import os
import sys

import numpy as np

from celerity_jax import markdown, run
from celerity_jax.collapse import curves, files
from celerity_jax.fileio import write_json_atomic, write_text_atomic

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STORED = os.path.join(ROOT, "benchmarks", "data", "cpu-families", "tpp10")
SIZES = ("d48", "d64", "d80")  # the stored family, in the order that numbers its seeds
SEEDS = (0, 1)
BINS, SMOOTH, LO = 50, 3, 0.2
DEEP_SIZE, DEEP_LAYERS = "d48", 8


def spec(workdir: str, dtype: str, size: str, seed: int, layers: int | None = None) -> run.RunSpec:
    exp = os.path.dirname(HERE)
    files_ = (os.path.join(exp, "tiny", f"{size}.gin"), os.path.join(exp, "demo", "tau.gin"),
              os.path.join(exp, "demo", "eval.gin"))
    params = ("RecipeConfig.tpp = 10.0", f"TrainConfig.seed = {seed * len(SIZES) + SIZES.index(size)}",
              f"ModelConfig.residual_dtype = '{dtype}'") + ((f"ModelConfig.n_layers = {layers}",) if layers else ())
    name = f"{dtype}/{size}{f'-l{layers}' if layers else ''}/seed{seed}"
    return run.RunSpec(os.path.join(workdir, name), files_, params, name=name)


def measure(path: str) -> dict:
    """The normalized training curve on the grid and the final smoothed train and eval losses of a run."""
    curve, final = curves.normalize_run(files.load_curve(path), BINS, SMOOTH)
    _, eval_final = curves.normalize_run(files.load_curve(path, loss="eval"), BINS, 1)
    return {"curve": curve, "train_final": final, "eval_final": eval_final}


def compare(a: dict, b: dict, frac_G: np.ndarray) -> dict:
    keep = frac_G >= LO
    return {"curve_mean_abs": float(np.mean(np.abs(a["curve"] - b["curve"])[keep])),
            "train_final_rel": float(b["train_final"] / a["train_final"] - 1),
            "eval_final_rel": float(b["eval_final"] / a["eval_final"] - 1)}


def cell(label: str, float32_dir: str, bfloat16_dir: str, frac_G: np.ndarray) -> tuple[list[dict], dict]:
    """The rows of one size (each seed's bfloat16 run against its float32 run, beside the difference between the
    two float32 seeds) and its measured runs {(dtype, seed): measure}."""
    runs = {(dtype, seed): measure(os.path.join(folder, f"seed{seed}"))
            for dtype, folder in (("float32", float32_dir), ("bfloat16", bfloat16_dir)) for seed in SEEDS}
    seeds = compare(runs[("float32", 0)], runs[("float32", 1)], frac_G)
    return [{"size": label, "seed": seed, "bfloat16_vs_float32": compare(runs[("float32", seed)],
                                                                         runs[("bfloat16", seed)], frac_G),
             "seed1_vs_seed0_float32": seeds} for seed in SEEDS], runs


def report(workdir: str) -> dict:
    frac_G = curves.bin_centers(BINS)
    rows, family_runs = [], {}
    for size in SIZES:
        size_rows, family_runs[size] = cell(size, os.path.join(STORED, size), os.path.join(workdir, "bfloat16", size),
                                            frac_G)
        rows += size_rows
    deep = f"{DEEP_SIZE}-l{DEEP_LAYERS}"
    rows += cell(deep, os.path.join(workdir, "float32", deep), os.path.join(workdir, "bfloat16", deep), frac_G)[0]
    n_params = [files.load_curve(os.path.join(STORED, size, "seed0")).controls.n_params for size in SIZES]
    family = {dtype: curves.family_measures(np.array([[family_runs[size][(dtype, seed)]["curve"] for seed in SEEDS]
                                                      for size in SIZES]), n_params, frac_G, LO)
              for dtype in ("float32", "bfloat16")}
    rerun = os.path.join(workdir, "float32", "d48", "seed0", files.CURVE_CSV)
    with open(rerun) as f, open(os.path.join(STORED, "d48", "seed0", files.CURVE_CSV)) as g:
        identical = f.read() == g.read()
    return {"rows": rows, "family": family, "float32_rerun_identical": identical, "bins": BINS,
            "smooth_bins": SMOOTH, "lo": LO}


def write(results: dict) -> None:
    metrics = (("curve_mean_abs", "{:.4f}"), ("train_final_rel", "{:+.2%}"), ("eval_final_rel", "{:+.2%}"))
    table = [[r["size"], r["seed"]] + [form.format(r[side][metric]) for metric, form in metrics
                                       for side in ("bfloat16_vs_float32", "seed1_vs_seed0_float32")]
             for r in results["rows"]]
    lines = ["<!-- generated by `python experiments/residual_dtype/run.py`; do not edit by hand -->",
             "# A bfloat16 residual stream against seed noise", "",
             f"Normalized training curves (binned on {results['bins']} points of t̂, smoothed over "
             f"{results['smooth_bins']}) compared over t̂ ≥ {results['lo']}: mean |Δℓ|. Final losses: the last "
             "smoothed bin of the training curve, the last eval point. Each bfloat16 run is compared with the "
             "float32 run of the same size and seed; the seed columns compare the two float32 seeds of the size. "
             f"{DEEP_SIZE}-l{DEEP_LAYERS}: d48 at {DEEP_LAYERS} layers (CompleteP's residual multiplier 1/4), both "
             "dtypes trained here.", ""]
    lines += markdown.table(["size", "seed", "curve: bf16 − f32", "curve: seed 1 − seed 0", "train final: bf16 vs f32",
                             "train final: seed 1 vs 0", "eval final: bf16 vs f32", "eval final: seed 1 vs 0"], table)
    lines += ["", "Each family's collapse over the same range (`curves.family_measures`):", ""]
    lines += markdown.table(["residual", "Δ/σ (floor)", "trend with ln N (slope / SE)", "MAE"],
                            [[dtype, f"{m['delta_over_sigma']:.2f} ({m['floor']:.2f})", f"{m['trend']:+.2f}",
                              f"{m['mae']:.4f}"] for dtype, m in results["family"].items()])
    lines += ["", "The float32 rerun of d48 seed 0 with today's code gives "
              + ("a `curve.csv` identical byte for byte to the stored one." if results["float32_rerun_identical"]
                 else "a `curve.csv` that differs from the stored one.")]
    write_text_atomic(os.path.join(HERE, "results.md"), "\n".join(lines) + "\n")
    write_json_atomic(os.path.join(HERE, "results.json"), results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=os.path.join(ROOT, "runs", "residual_dtype"))
    parser.add_argument("--report", action="store_true", help="only rewrite the results from finished runs")
    args = parser.parse_args()
    if not args.report:
        specs = [spec(args.workdir, "float32", "d48", 0)]
        specs += [spec(args.workdir, "bfloat16", size, seed) for seed in SEEDS for size in SIZES]
        specs += [spec(args.workdir, dtype, DEEP_SIZE, seed, DEEP_LAYERS) for dtype in ("float32", "bfloat16")
                  for seed in SEEDS]
        for s in specs:
            loaded = run.load(s)
            loaded.train_to(log=lambda *a, **k: None)
            print(f"{s.name}: {loaded.train_seconds():.0f} s", flush=True)
    write(report(args.workdir))
    print(f"wrote {os.path.join(HERE, 'results.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
