"""Proxy tuning of the tiny recipe: which base LR, initial std and TPP make the tiny family collapse.

    python experiments/proxy_tuning/run.py --stage lr      # base LR × sigma_base on the d_base=32 proxy
    python experiments/proxy_tuning/run.py --stage family  # the tiny family at candidate TPPs
    python experiments/proxy_tuning/run.py                 # only rewrite results.md

Runs live in --workdir (default runs/proxy_tuning/<run name>); rerunning skips finished runs (a run
directory of another config, after base.gin changed, is refused) and resumes unfinished ones.
Every stage trains from experiments/tiny/base.gin plus the overrides listed below, so a change to
base.gin shows up here on the next run. Results accumulate in experiments/proxy_tuning/results.json.
"""

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.dirname(HERE)
RESULTS_JSON = os.path.join(HERE, "results.json")

PROXY = ("ModelConfig.d_model = 32", "ModelConfig.n_heads = 2", "ModelConfig.n_layers = 2")


def stage_runs(stage: str) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (gin files, gin params) of every run in `stage`."""
    base = [os.path.join(EXPERIMENTS, "tiny", "base.gin")]
    fixed = ["RecipeConfig.batch_seqs = 16", "RecipeConfig.tpp = 4"]
    runs = {}
    if stage == "lr":
        for lr in (3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2):
            for sigma in (0.04, 0.08, 0.16):
                runs[f"lr/lr{lr:g}_s{sigma:g}"] = (base, list(PROXY) + fixed + [
                    f"RecipeConfig.base_lr = {lr!r}", f"ModelConfig.sigma_base = {sigma!r}"])
    elif stage == "transfer":
        for size in ("d64",):
            for lr in (6e-3, 1.2e-2, 2.4e-2):
                runs[f"transfer/{size}_lr{lr:g}"] = (_size_files(size), fixed + [f"RecipeConfig.base_lr = {lr!r}"])
    elif stage == "family":
        for tpp, sizes in ((4, ("d32", "d48", "d64", "d80")), (10, ("d32", "d48", "d64", "d80"))):
            for size in sizes:
                files = base if size == "d32" else _size_files(size)
                extra = list(PROXY) if size == "d32" else []
                runs[f"family/tpp{tpp}_{size}"] = (files, extra + ["RecipeConfig.batch_seqs = 16",
                                                                   f"RecipeConfig.tpp = {tpp}"])
    elif stage == "steps":  # batch ∝ N, so every size takes the same number of steps
        for size, batch in (("d64", 27), ("d80", 41)):
            runs[f"steps/tpp4_{size}"] = (_size_files(size), [f"RecipeConfig.batch_seqs = {batch}", "RecipeConfig.tpp = 4"])
    elif stage == "seeds":  # seed noise: a second d64 seed, and naive runs that do not share batch order
        runs["seeds/tpp10_d64_seed1"] = (_size_files("d64"), ["RecipeConfig.batch_seqs = 16", "RecipeConfig.tpp = 10",
                                                              "TrainConfig.seed = 1"])
        for name, (files, params) in stage_runs("naive").items():
            if name.startswith("naive/tpp10_wd1_"):
                size = name.rsplit("_", 1)[1]
                runs[f"seeds/naive_tpp10_wd1_{size}_seed{size[1:]}"] = (files, params + [f"TrainConfig.seed = {size[1:]}"])
    elif stage == "naive":
        from celerity_jax import gin_config, recipe

        n_middle = recipe.params.count_params(gin_config.parse_gin(_size_files("d64")).model)
        for tpp_middle, wd in ((4, 0.1), (4, 2.0), (10, 1.0)):
            tokens = tpp_middle * n_middle
            for size in ("d48", "d64", "d80"):
                n = recipe.params.count_params(gin_config.parse_gin(_size_files(size)).model)
                runs[f"naive/tpp{tpp_middle}_wd{wd:g}_{size}"] = (_size_files(size), [
                    "RecipeConfig.batch_seqs = 16", "RecipeConfig.tau = None",
                    f"RecipeConfig.weight_decay = {wd!r}", f"RecipeConfig.tpp = {tokens / n!r}"])
    else:
        raise SystemExit(f"unknown stage {stage!r}; use lr, transfer, family or naive")
    return runs


def _size_files(size: str) -> list[str]:
    return [os.path.join(EXPERIMENTS, "tiny", f"{size}.gin")]


def final_loss(workdir: str) -> float:
    """Mean training loss over the last 5% of steps (the curve's end, less noisy than one step)."""
    from celerity_jax.collapse import files

    curve = files.load_curve(workdir)
    return float(curve.loss_T[curve.frac_T >= 0.95].mean())


def train_stage(stage: str, root: str) -> None:
    from celerity_jax import run

    results = _load_results()
    for name, (files, params) in stage_runs(stage).items():
        workdir = os.path.join(root, name)
        loaded = run.load(run.RunSpec(workdir, tuple(files), tuple(params)))
        if name in results and loaded.finished():
            continue
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            summary = loaded.train_to(log=lambda _: None)
        plan = loaded.plan
        results[name] = {"params": params, "n_params": plan.n_params, "tpp": plan.tpp, "tau": plan.tau,
                         "steps": plan.steps, "final_loss": final_loss(workdir), "seconds": loaded.train_seconds(),
                         "stopped": "finished" if summary is None else summary["stopped"], "workdir": workdir}
        print(f"{name}: final {results[name]['final_loss']:.4f} ({results[name]['seconds']:.0f} s)", flush=True)
        _save_results(results)


def _load_results() -> dict:
    if not os.path.isfile(RESULTS_JSON):
        return {}
    with open(RESULTS_JSON) as f:
        return json.load(f)


def _save_results(results: dict) -> None:
    from celerity_jax.fileio import write_json_atomic

    write_json_atomic(RESULTS_JSON, results)


def write_report(root: str) -> str:
    """results.md: the LR × sigma grid, the transfer check and each family's collapse spread."""
    from celerity_jax import markdown
    from celerity_jax.collapse import compare, files
    from celerity_jax.fileio import write_text_atomic

    results = _load_results()
    lines = ["# Proxy tuning of the tiny recipe", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores; written {time.strftime('%Y-%m-%d %H:%M')} "
             "by `python experiments/proxy_tuning/run.py`. Final loss = mean training loss over the last 5% of steps.",
             ""]
    grid = {k: v for k, v in results.items() if k.startswith("lr/")}
    if grid:
        lines += ["## Base LR × sigma_base on the proxy (d_model 32 = d_base, 2 layers, TPP 4, batch 16)", ""]
        rows = []
        for name, r in sorted(grid.items(), key=lambda kv: kv[1]["final_loss"]):
            lr, sigma = (p.split(" = ")[1] for p in r["params"] if p.startswith(("RecipeConfig.base_lr", "ModelConfig.sigma_base")))
            rows.append([lr, sigma, f"{r['final_loss']:.4f}"])
        lines += markdown.table(["base_lr", "sigma_base", "final loss"], rows) + [""]
    transfer = {k: v for k, v in results.items() if k.startswith("transfer/")}
    if transfer:
        lines += ["## Does the LR transfer? (d64, TPP 4, batch 16)", ""]
        lines += markdown.table(["run", "final loss"], ([k, f"{v['final_loss']:.4f}"] for k, v in sorted(transfer.items())))
        lines.append("")
    groups = [
        ("tau law, TPP 4, batch 16", "family/tpp4_", ("d48", "d64", "d80")),
        ("tau law, TPP 4, batch 16, with d32", "family/tpp4_", ("d32", "d48", "d64", "d80")),
        ("tau law, TPP 4, batch ∝ N (16/27/41: equal steps)", None,
         ("family/tpp4_d48", "steps/tpp4_d64", "steps/tpp4_d80")),
        ("tau law, TPP 10, batch 16", "family/tpp10_", ("d48", "d64", "d80")),
        ("tau law, TPP 10, batch 16, with d32", "family/tpp10_", ("d32", "d48", "d64", "d80")),
        ("naive: λ 0.1, batch 16, d64's TPP-4 budget", "naive/tpp4_wd0.1_", ("d48", "d64", "d80")),
        ("naive: λ 2, batch 16, d64's TPP-4 budget", "naive/tpp4_wd2_", ("d48", "d64", "d80")),
        ("naive: λ 1, batch 16, d64's TPP-10 budget", "naive/tpp10_wd1_", ("d48", "d64", "d80")),
        ("the same, one seed (batch order) per size", "seeds/naive_tpp10_wd1_", ("d48_seed48", "d64_seed64", "d80_seed80")),
        ("seed noise: d64, tau law, TPP 10, seeds 0 and 1", None, ("family/tpp10_d64", "seeds/tpp10_d64_seed1")),
    ]
    rows = []
    for label, prefix, members in groups:
        names = [(prefix or "") + m for m in members]
        if not all(n in results for n in names):
            continue
        curves = [files.load_curve(results[n]["workdir"]) for n in names]
        quality = compare.compare_family(curves, n_bins=100, smooth_bins=5).quality
        finals = ", ".join(f"{results[n]['final_loss']:.3f}" for n in names)
        rows.append([label, ", ".join(names), finals, f"{quality['mean_abs_dev']:.4f}"])
    lines += ["## Collapse of the family", ""]
    lines += markdown.table(["family", "runs", "final losses", "mean abs deviation (t̂ 0.2-1, 100 bins / 5)"], rows)
    lines.append("")
    path = os.path.join(HERE, "results.md")
    write_text_atomic(path, "\n".join(lines))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", action="append", default=[], help="lr, transfer or family (repeatable)")
    parser.add_argument("--workdir", default="runs/proxy_tuning")
    args = parser.parse_args()
    for stage in args.stage:
        train_stage(stage, args.workdir)
    print(f"wrote {write_report(args.workdir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
