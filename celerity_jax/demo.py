"""`celerity demo`: the main job. A tiny CompleteP family trained twice on the built-in corpus.

- `tau` recipe: every size at one TPP with τ pinned (weight decay derived from it);
- `naive` recipe: one batch, one weight decay and one token budget for all sizes (TPP and τ vary).

Then `collapse.png` (normalized curves and residuals, both recipes side by side) and `report.md`
(collapse quality of each recipe and their ratio). Each run is an ordinary run directory with its own
TensorBoard events: `tensorboard --logdir <workdir>`. Rerunning resumes unfinished runs and skips finished
ones. The command line is `celerity_jax/cli/demo.py`.

This module imports only the standard library and light project modules at the top, so that the command
line can read its defaults cheaply; the rest is imported where it is used.
"""

import dataclasses
import json
import os
import platform
import time

from celerity_jax import markdown
from celerity_jax.errors import ConfigError

SIZES = ("d48", "d64", "d80")
RECIPES = ("tau", "naive")
TARGET_RATIO = 3.0
# Where the seed-noise floor of the collapse measure was measured (the "seed noise" row).
SEED_NOISE_RESULTS = "experiments/proxy_tuning/results.md"


def experiments_dir() -> str:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
    if not os.path.isdir(os.path.join(path, "demo")):
        raise ConfigError(f"the demo's gin files are not at {path}/demo; run `celerity demo` from a checkout "
                          "of the repository (pip install -e .)")
    return path


@dataclasses.dataclass(frozen=True)
class DemoRun:
    recipe: str
    size: str
    gin_files: tuple[str, ...]
    gin_params: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.recipe}/{self.size}"

    def workdir(self, demo_dir: str) -> str:
        return os.path.join(demo_dir, self.recipe, self.size)


def demo_runs(sizes: tuple[str, ...], quick: bool) -> list[DemoRun]:
    """The runs of both recipes; the naive token budget is the middle size's under the tau recipe.

    Each size gets its own seed (the same in both recipes): runs that share a seed and a step count see
    the same batches at the same t̂, and that shared noise would cancel in the family's spread
    (experiments/proxy_tuning/README.md §5)."""
    from celerity_jax import gin_config, recipe

    exp = experiments_dir()
    extra = (os.path.join(exp, "demo", "quick.gin"),) if quick else ()
    tau_files = {s: (os.path.join(exp, "tiny", f"{s}.gin"), os.path.join(exp, "demo", "tau.gin")) + extra
                 for s in sizes}
    seeds = {s: f"TrainConfig.seed = {i}" for i, s in enumerate(sizes)}
    runs = [DemoRun("tau", s, tau_files[s], (seeds[s],)) for s in sizes]
    middle = gin_config.parse_gin(tau_files[sizes[len(sizes) // 2]])
    naive_tokens = recipe.make_plan(middle.model, middle.recipe).tokens
    for s in sizes:
        files = (os.path.join(exp, "tiny", f"{s}.gin"), os.path.join(exp, "demo", "naive.gin"))
        n_params = recipe.params.count_params(gin_config.parse_gin(files).model)
        runs.append(DemoRun("naive", s, files, (f"RecipeConfig.tpp = {naive_tokens / n_params!r}", seeds[s])))
    return runs


def run_demo(workdir: str, sizes: tuple[str, ...] = SIZES, quick: bool = False, force_new: bool = False,
             log=print) -> dict:
    """Trains every run of the demo unless it is finished, then writes the report; returns its summary."""
    from celerity_jax import run

    runs, seconds = demo_runs(sizes, quick), {}
    for r in runs:
        loaded = run.load(run.RunSpec(r.workdir(workdir), r.gin_files, r.gin_params, name=r.name))
        loaded.train_to(force_new=force_new, log=log)
        seconds[r.name] = loaded.train_seconds()
    return write_report(workdir, runs, seconds, quick=quick)


def write_report(workdir: str, runs: list[DemoRun], seconds: dict[str, float], quick: bool) -> dict:
    """Collapse quality per recipe, their ratio, the figure and report.md; `seconds`: each run's training
    time by name."""
    from celerity_jax.collapse import compare, files
    from celerity_jax.fileio import write_json_atomic, write_text_atomic

    families = {}
    for recipe_name in RECIPES:
        curves = [files.load_curve(r.workdir(workdir)) for r in runs if r.recipe == recipe_name]
        families[recipe_name] = compare.compare_family(curves, n_bins=100, smooth_bins=5)
    compare.plot_families({f"{name} recipe": fam for name, fam in families.items()},
                          os.path.join(workdir, "collapse.png"))
    summary = {name: fam.quality for name, fam in families.items()}
    summary["ratio"] = summary["naive"]["mean_abs_dev"] / summary["tau"]["mean_abs_dev"]
    rows = []
    for r in runs:
        with open(os.path.join(r.workdir(workdir), "plan.json")) as f:
            plan = json.load(f)
        row = next(x for x in families[r.recipe].rows if x["curve"].startswith(r.workdir(workdir)))
        rows.append([r.recipe, r.size, f"{plan['n_params']:,}", f"{plan['tpp']:.2f}", f"{plan['tau']:.3f}",
                     f"{plan['weight_decay']:.3g}", plan["batch_seqs"], plan["steps"], f"{row['final_loss']:.4f}",
                     f"{row['mae']:.4f}", f"{seconds.get(r.name, float('nan')):.0f}"])
    lines = [
        "# celerity demo: does the tau recipe collapse?", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}; "
        f"{'quick' if quick else 'full'} budget; {time.strftime('%Y-%m-%d %H:%M')}.", ""]
    lines += markdown.table(["recipe", "size", "N", "TPP", "tau", "weight decay", "batch (seqs)", "steps",
                             "final loss", "MAE vs family mean", "time (s)"], rows)
    lines += ["", "Collapse quality over t̂ in [0.2, 1] (normalized curves L(t̂)/L(T), 100 bins smoothed over 5):", ""]
    lines += markdown.table(["recipe", "mean abs deviation", "mean range", "max range"],
                            ([name] + [f"{summary[name][k]:.4f}" for k in ("mean_abs_dev", "mean_range", "max_range")]
                             for name in RECIPES))
    met = "met" if summary["ratio"] >= TARGET_RATIO else "NOT met"
    lines += ["", f"Ratio naive / tau of the mean absolute deviation: **{summary['ratio']:.2f}** "
                  f"(target >= {TARGET_RATIO:g}: {met}).", "",
              "Each size trains with its own seed (batch order), the same in both recipes. For scale: how much "
              "two seeds of one run differ on this measure (the \"seed noise\" row of "
              f"{SEED_NOISE_RESULTS}) is a floor under the tau recipe's spread.", "",
              "![collapse](collapse.png)", ""]
    write_text_atomic(os.path.join(workdir, "report.md"), "\n".join(lines))
    write_json_atomic(os.path.join(workdir, "report.json"), summary)
    return summary
