"""`celerity demo`: the main job. A tiny CompleteP family trained twice on the built-in corpus.

- `tau` recipe: every size at one TPP with τ pinned (weight decay derived from it), each size also with a
  second seed (the middle size only in quick mode), which measures the seed-to-seed noise;
- `naive` recipe: one batch, one weight decay and one token budget for all sizes (TPP and τ vary).

Collapse is measured on the eval loss: every run evaluates the same fixed held-out batches at the same 50
points of t̂ (experiments/demo/eval.gin), a curve without the batch-to-batch noise of the training loss.
Then `collapse.png` (normalized eval curves and residuals, both recipes side by side) and `report.md`:
collapse quality of each recipe and their ratio, Qiu et al.'s Δ/σ of the tau family, and the same numbers
on the training-loss curves for comparison. Last, the tau family's final checkpoints are scored downstream on
the built-in task (`celerity_jax/evaluate/builtin_task.py`, no download): the report's table says whether the
larger sizes score higher, and `frontier.png` draws the family's accuracy against training FLOPs with the
paper's form fitted, next to the paper's published points. Each run is an ordinary run directory with its own
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
TARGET_DELTA_OVER_SIGMA = 1.5
# The grid each loss curve is measured on: eval.gin's 50 points give two per bin; the training curve has a
# point per step.
GRIDS = {"eval": (25, 1), "train": (100, 5)}  # loss curve -> (bins, smoothing bins)
# Where the seed-noise floor of the collapse measure was measured (the "seed noise" row).
SEED_NOISE_RESULTS = "experiments/proxy_tuning/results.md"
DOWNSTREAM_DOCS = 1000  # documents of the built-in task scored per run


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
    replica: int = 0  # 0: the family's run of this size; 1: the same run with another seed

    @property
    def name(self) -> str:
        return f"{self.recipe}/{self.size}" + (f"-seed{self.replica}" if self.replica else "")

    def workdir(self, demo_dir: str) -> str:
        return os.path.join(demo_dir, *self.name.split("/"))


def demo_runs(sizes: tuple[str, ...], quick: bool) -> list[DemoRun]:
    """The runs of both recipes; the naive token budget is the middle size's under the tau recipe.

    Each size gets its own seed (the same in both recipes): runs that share a seed and a step count see
    the same batches at the same t̂, and that shared noise would cancel in the family's spread
    (experiments/proxy_tuning/README.md §5). The tau recipe's second seeds follow after the first ones."""
    from celerity_jax import gin_config, recipe

    exp = experiments_dir()
    eval_gin = os.path.join(exp, "demo", "eval.gin")
    extra = (os.path.join(exp, "demo", "quick.gin"),) if quick else ()
    tau_files = {s: (os.path.join(exp, "tiny", f"{s}.gin"), os.path.join(exp, "demo", "tau.gin"), eval_gin) + extra
                 for s in sizes}
    seed = {s: i for i, s in enumerate(sizes)}
    runs = [DemoRun("tau", s, tau_files[s], (f"TrainConfig.seed = {seed[s]}",)) for s in sizes]
    middle = sizes[len(sizes) // 2]
    middle_configs = gin_config.parse_gin(tau_files[middle])
    naive_tokens = recipe.make_plan(middle_configs.model, middle_configs.recipe).tokens
    for s in sizes:
        files = (os.path.join(exp, "tiny", f"{s}.gin"), os.path.join(exp, "demo", "naive.gin"), eval_gin)
        n_params = recipe.params.count_params(gin_config.parse_gin(files).model)
        runs.append(DemoRun("naive", s, files, (f"RecipeConfig.tpp = {naive_tokens / n_params!r}",
                                                f"TrainConfig.seed = {seed[s]}")))
    for s in ((middle,) if quick else sizes):
        runs.append(DemoRun("tau", s, tau_files[s], (f"TrainConfig.seed = {len(sizes) + seed[s]}",), replica=1))
    return runs


def run_demo(workdir: str, sizes: tuple[str, ...] = SIZES, quick: bool = False, force_new: bool = False,
             gin_files: tuple[str, ...] = (), gin_params: tuple[str, ...] = (), log=print) -> dict:
    """Trains every run of the demo unless it is finished, then writes the report; returns its summary.
    `gin_files` and `gin_params` are layered on every run after its own (to try a variant of both recipes)."""
    from celerity_jax import run

    runs = [dataclasses.replace(r, gin_files=r.gin_files + tuple(gin_files),
                                gin_params=r.gin_params + tuple(gin_params)) for r in demo_runs(sizes, quick)]
    seconds = {}
    for r in runs:
        loaded = run.load(run.RunSpec(r.workdir(workdir), r.gin_files, r.gin_params, name=r.name))
        loaded.train_to(force_new=force_new, log=log)
        seconds[r.name] = loaded.train_seconds()
    downstream = score_downstream(workdir, [r for r in runs if r.recipe == "tau" and not r.replica], log)
    return write_report(workdir, runs, seconds, quick=quick, variant=tuple(gin_files) + tuple(gin_params),
                        downstream=downstream)


def score_downstream(workdir: str, runs: list[DemoRun], log=print) -> dict[str, dict]:
    """Each run's results file at its final checkpoint with the built-in task scored on DOWNSTREAM_DOCS
    documents (scored now unless the file holds that score already), by run name."""
    from celerity_jax.evaluate import builtin_task, harness, loader, results

    out = {}
    for r in runs:
        run_dir = r.workdir(workdir)
        content = results.load(run_dir, loader.saved_step(run_dir, None))
        if (content or {}).get("tasks", {}).get(builtin_task.TASK_NAME, {}).get("docs") != DOWNSTREAM_DOCS:
            log(f"\n== {r.name}: scoring the built-in task {builtin_task.TASK_NAME} ({DOWNSTREAM_DOCS} documents)")
            content = harness.evaluate_checkpoint(run_dir, None, builtin_task.TASK_NAME, None, DOWNSTREAM_DOCS)
        out[r.name] = content
    return out


def measure(runs: list[DemoRun], curves: dict, loss: str) -> tuple[dict, dict]:
    """(family comparison per recipe, summary) on one loss curve (`curves`: each run's, by name): each recipe's
    first-seed family, the ratio of their mean absolute deviations, and Qiu et al.'s Δ/σ of the tau family over
    all its seeds."""
    from celerity_jax.collapse import compare

    n_bins, smooth_bins = GRIDS[loss]

    def family(recipe_name: str, replicas: bool) -> compare.FamilyComparison:
        members = [curves[r.name] for r in runs if r.recipe == recipe_name and (replicas or not r.replica)]
        return compare.compare_family(members, n_bins=n_bins, smooth_bins=smooth_bins)

    families = {name: family(name, replicas=False) for name in RECIPES}
    summary = {name: fam.quality for name, fam in families.items()}
    summary["ratio"] = summary["naive"]["mean_abs_dev"] / summary["tau"]["mean_abs_dev"]
    summary["supercollapse"] = family("tau", replicas=True).quality.get("supercollapse")
    return families, summary


def write_report(workdir: str, runs: list[DemoRun], seconds: dict[str, float], quick: bool,
                 variant: tuple[str, ...] = (), downstream: dict[str, dict] | None = None) -> dict:
    """Collapse quality per recipe on the eval and the training curves, their ratios, the tau family's Δ/σ,
    the figure and report.md; `seconds`: each run's training time by name; `downstream`: the tau family's
    results files (`score_downstream`), for the downstream table and frontier.png. Returns the eval summary,
    with the training-curve summary under "train" and the downstream one under "downstream"."""
    from celerity_jax.collapse import compare, files
    from celerity_jax.fileio import write_json_atomic, write_text_atomic

    curves = {loss: {r.name: files.load_curve(r.workdir(workdir), loss=loss) for r in runs} for loss in GRIDS}
    measured = {loss: measure(runs, curves[loss], loss) for loss in GRIDS}
    families, summary = measured["eval"]
    compare.plot_families({f"{name} recipe": fam for name, fam in families.items()},
                          os.path.join(workdir, "collapse.png"))
    rows = []
    for r in runs:
        with open(os.path.join(r.workdir(workdir), "plan.json")) as f:
            plan = json.load(f)
        mae = "(seed noise)" if r.replica else next(f"{x['mae']:.4f}" for x in families[r.recipe].rows
                                                    if x["curve"].startswith(r.workdir(workdir)))
        rows.append([r.recipe, r.name.split("/")[1], f"{plan['n_params']:,}", f"{plan['tpp']:.2f}",
                     f"{plan['tau']:.3f}", f"{plan['weight_decay']:.3g}", plan["batch_seqs"], plan["steps"],
                     f"{curves['eval'][r.name].loss_T[-1]:.4f}", mae, f"{seconds.get(r.name, float('nan')):.0f}"])
    lines = [
        "# celerity demo: does the tau recipe collapse?", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}; "
        f"{'quick' if quick else 'full'} budget; {time.strftime('%Y-%m-%d %H:%M')}."
        + (f" Layered on every run: {'; '.join(variant)}." if variant else ""), ""]
    lines += markdown.table(["recipe", "run", "N", "TPP", "tau", "weight decay", "batch (seqs)", "steps",
                             "final eval loss", "MAE vs family mean (eval)", "time (s)"], rows)
    lines += ["", "Collapse quality over t̂ in [0.2, 1] of the normalized curves L(t̂)/L(T), each recipe's "
                  "first-seed family. Eval: the loss on fixed held-out batches at 50 points of t̂ (experiments/demo/eval.gin), "
                  f"{GRIDS['eval'][0]} bins; train: the training loss of every step, {GRIDS['train'][0]} bins "
                  f"smoothed over {GRIDS['train'][1]}.", ""]
    lines += markdown.table(["loss curve", "recipe", "mean abs deviation", "mean range", "max range"],
                            ([loss, name] + [f"{measured[loss][1][name][k]:.4f}"
                                             for k in ("mean_abs_dev", "mean_range", "max_range")]
                             for loss in GRIDS for name in RECIPES))
    lines.append("")
    for loss in GRIDS:
        s = measured[loss][1]
        met = "met" if s["ratio"] >= TARGET_RATIO else "NOT met"
        lines.append(f"- {loss} curves: ratio naive / tau of the mean absolute deviation **{s['ratio']:.2f}** "
                     f"(target >= {TARGET_RATIO:g}: {met}); " + _supercollapse_text(s["supercollapse"]))
    lines += ["", "Each size trains with its own seed (batch order), the same in both recipes; the tau recipe's "
                  "second seeds measure σ, the seed-to-seed spread, against Δ, the spread across sizes of the "
                  f"seed-mean curves (Qiu et al.'s supercollapse: Δ < σ). Earlier floor on the training curve: "
                  f"{SEED_NOISE_RESULTS}.", "", "![collapse](collapse.png)", ""]
    downstream_summary = None
    if downstream:
        downstream_lines, downstream_summary = _downstream_report(workdir, downstream)
        lines += downstream_lines
    write_text_atomic(os.path.join(workdir, "report.md"), "\n".join(lines))
    summary = {"loss": "eval", **summary, "train": measured["train"][1], "downstream": downstream_summary}
    write_json_atomic(os.path.join(workdir, "report.json"), summary)
    return summary


def _supercollapse_text(supercollapse: dict | None) -> str:
    if supercollapse is None:
        return "no second seed, so no Δ/σ"
    met = "met" if supercollapse["ratio"] <= TARGET_DELTA_OVER_SIGMA else "NOT met"
    return (f"tau family Δ/σ = {supercollapse['delta']:.4f} / {supercollapse['sigma']:.4f} = "
            f"**{supercollapse['ratio']:.2f}** (target <= {TARGET_DELTA_OVER_SIGMA:g}: {met})")


def _downstream_report(workdir: str, downstream: dict[str, dict]) -> tuple[list[str], dict]:
    """The report's downstream section and summary: the tau family's built-in-task scores by size, whether they
    rise with size, and frontier.png with the paper's form fitted to them (or why there is no fit)."""
    from celerity_jax.evaluate import builtin_task, frontier, results

    task = builtin_task.TASK_NAME
    by_size = sorted(downstream.items(), key=lambda item: item[1]["n_params"])
    scores = {name: c["tasks"][task] for name, c in by_size}
    rows = [[name, f"{c['n_params']:,}", f"{c['train_flops']:.3g}", f"{100 * scores[name]['value']:.2f}",
             f"{100 * scores[name]['stderr']:.2f}", scores[name]["docs"]] for name, c in by_size]
    accs = [scores[name]["value"] for name, _ in by_size]
    rising = all(a < b for a, b in zip(accs, accs[1:]))
    lines = ["## Downstream: the built-in task", "",
             f"The tau family's final checkpoints scored by `celerity eval --tasks {task}`: pick the true rest of a "
             "held-out standard-library line among 4 (chance 25%), metric acc.", ""]
    lines += markdown.table(["run", "N", "training FLOPs", "acc (%)", "stderr (%)", "documents"], rows)
    by_n = ", ".join(f"{name.split('/')[1]} {100 * a:.2f}%" for (name, _), a in zip(by_size, accs))
    lines += ["", f"- Larger sizes score higher: **{'yes' if rising else 'no'}** ({by_n}, in order of N)."]
    points = frontier.load_points([results.result_path(c["workdir"], c["step"]) for _, c in by_size])
    try:
        fit = frontier.fit_frontier([p.flops for p in points], [p.accuracy for p in points])
    except ConfigError as e:
        lines += [f"- No frontier fit: {e}.", ""]
        return lines, {"rising": rising, "scores": scores, "fit": None}
    frontier.plot_frontier(points, frontier.load_published(), fit, os.path.join(workdir, "frontier.png"))
    lines += [f"- The paper's form {frontier.FORM} fitted to them: k = {fit.k:.4g}, log10 C₀ = {fit.log10_c0:.4g}. "
              "The paper's points (its seven tasks) are drawn on their own axis: a different measure.", "",
              "![frontier](frontier.png)", ""]
    return lines, {"rising": rising, "scores": scores, "fit": {"k": fit.k, "log10_c0": fit.log10_c0}}
