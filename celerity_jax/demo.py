"""`celerity demo`: the paper's mechanism in three panels, each measured against seed noise, on a CPU.

1. `timescale`: at the smallest size, settings of (batch, LR, weight decay) with equal AdamW timescale τ trace
   one curve, and τ/4 and 4τ trace others;
2. `tpp`: at the same size and τ, half and twice the tokens per parameter trace other curves;
3. `family`: sizes at one TPP under the τ recipe (τ from the law, λ derived), each with seeds, measured for
   collapse against seed noise, beside the naive recipe (Llama-2's practice: one token budget, LR, batch and
   weight decay for every size).

A `Design` says which family and seeds a form trains: QUICK (panels 1 and 2), DEFAULT (`make demo`) and FULL
(`--full`, a wider family scored downstream on the built-in task). Every run of every form sits in the short-run
regime (collapse/regime.py). Every run evaluates the same fixed held-out batches at 50 points of t̂
(experiments/demo/eval.gin); the demo's collapse measure is that eval curve divided by its final value, over t̂ in
[0.2, 1]. The measures, the figure and the report are `demo_report.py`. Each run is an ordinary run directory
with its own TensorBoard events; rerunning resumes unfinished runs and skips finished ones. The command line is
`celerity_jax/cli/demo.py`.

This module imports only the standard library and light project modules at the top, so that the command
line can read its defaults cheaply; the rest is imported where it is used.
"""

import dataclasses
import os

from celerity_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Design:
    """What one form of the demo trains besides panels 1 and 2: the family's sizes (smallest first; none for
    --quick), how many seeds each size gets under each recipe, and whether the family is scored downstream."""
    name: str
    sizes: tuple[str, ...]  # experiments/demo/sizes/<size>.gin
    tau_seeds: int
    naive_seeds: int
    downstream: bool  # score the τ family's first seeds on the built-in task


QUICK = Design("quick", (), 0, 0, False)
# Each form's family is the widest its budget allows on this project's 2-core host with every run in the
# short-run regime (experiments/demo/README.md): `make demo` 12 minutes, --full 45.
DEFAULT = Design("default", ("d40-l2", "d48-l2", "d56-l2"), 2, 2, False)
FULL = Design("full", ("d40-l2", "d48-l3", "d56-l3", "d64-l4"), 3, 2, True)
# Panel 1, at the smallest size: (batch ×, LR ×, τ ×) against the τ recipe's run. λ follows from τ, so the
# first three change λ by ×2, ×2 and ×1 at equal τ; the last two move τ. A larger batch evaluates fewer eval
# batches, so that every run sees the same held-out sequences.
TIMESCALE_SETTINGS = {
    "batch-x2": (2, 1.0, 1.0),
    "lr-half": (1, 0.5, 1.0),
    "batch-x2-lr-x2": (2, 2.0, 1.0),
    "tau-div4": (1, 1.0, 0.25),
    "tau-x4": (1, 1.0, 4.0),
}
TPP_SETTINGS = {"tpp-half": 0.5, "tpp-x2": 2.0}  # panel 2: TPP × at the τ recipe's τ, smallest size
PANEL_REPEATS = 3  # repeats of panel 1's base run with other seeds: σ of panels 1 and 2
PANEL_SIZE = "d40-l2"
DOWNSTREAM_DOCS = 1000  # documents of the built-in task scored per run


def experiments_dir() -> str:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
    if not os.path.isdir(os.path.join(path, "demo")):
        raise ConfigError(f"the demo's gin files are not at {path}/demo; run `celerity demo` from a checkout "
                          "of the repository (pip install -e .)")
    return path


@dataclasses.dataclass(frozen=True)
class DemoRun:
    group: str   # "tau" or "naive" (the family, panel 3), "timescale" (panel 1) or "tpp" (panel 2)
    label: str   # the size for the family, else the setting
    gin_files: tuple[str, ...]
    gin_params: tuple[str, ...]
    replica: int = 0  # 0: the run itself; k: its k-th repeat with another seed
    tau_factor: float = 1.0  # its τ over the τ recipe's (panel 1's off-τ settings)

    @property
    def name(self) -> str:
        return f"{self.group}/{self.label}" + (f"-seed{self.replica}" if self.replica else "")

    def workdir(self, demo_dir: str) -> str:
        return os.path.join(demo_dir, *self.name.split("/"))


def demo_runs(design: Design = DEFAULT, sizes: tuple[str, ...] | None = None) -> list[DemoRun]:
    """Every run of the demo: panels 1 and 2 at PANEL_SIZE, then the family of `design` (or of `sizes`, with the
    design's seeds) under both recipes. Each run has a seed of its own, except that a size's k-th seed is
    shared (batch order) by the two recipes."""
    from celerity_jax import gin_config, recipe
    from celerity_jax.demo_report import RECIPES

    if sizes is not None and not design.sizes:
        raise ConfigError("--sizes names the family's sizes, and --quick trains no family; drop one of them")
    sizes = design.sizes if sizes is None else sizes
    if design.sizes and len(sizes) < 2:
        raise ConfigError(f"--sizes names {len(sizes)} size; the demo's family needs at least two")
    if len(set(sizes)) < len(sizes):
        raise ConfigError(f"--sizes names a size twice ({','.join(sizes)}); name each once, smallest first")
    demo = os.path.join(experiments_dir(), "demo")
    recipe_files = {name: os.path.join(demo, f"{name}.gin") for name in RECIPES}
    eval_gin = os.path.join(demo, "eval.gin")
    size_gin = {s: os.path.join(demo, "sizes", f"{s}.gin") for s in (PANEL_SIZE,) + tuple(sizes)}
    for path in size_gin.values():
        if not os.path.isfile(path):
            raise ConfigError(f"no size file {path}; --sizes takes names of experiments/demo/sizes/*.gin")
    seeds = iter(range(1000))
    panel_files = (size_gin[PANEL_SIZE], recipe_files["tau"], eval_gin, os.path.join(demo, "panels.gin"))
    base_configs = gin_config.parse_gin(panel_files)
    base, eval_batches = base_configs.recipe, base_configs.train.eval_batches
    base_tau = recipe.tau_law(base.tpp, base.tau_law_coef, base.tau_law_exponent) if base.tau is None else base.tau
    runs = [DemoRun("timescale", "base", panel_files, (f"TrainConfig.seed = {next(seeds)}",), replica=k)
            for k in range(PANEL_REPEATS + 1)]
    runs += [DemoRun("timescale", name, panel_files,
                     (f"RecipeConfig.batch_seqs = {base.batch_seqs * b}", f"RecipeConfig.base_lr = {base.base_lr * lr!r}",
                      f"RecipeConfig.tau = {base_tau * t!r}", f"TrainConfig.eval_batches = {eval_batches // b}",
                      f"TrainConfig.seed = {next(seeds)}"), tau_factor=t)
             for name, (b, lr, t) in TIMESCALE_SETTINGS.items()]
    runs += [DemoRun("tpp", name, panel_files,
                     (f"RecipeConfig.tpp = {base.tpp * x!r}", f"RecipeConfig.tau = {base_tau!r}",
                      f"TrainConfig.seed = {next(seeds)}"))
             for name, x in TPP_SETTINGS.items()]
    if not design.sizes:
        return runs
    tau_files = {s: (size_gin[s], recipe_files["tau"], eval_gin) for s in sizes}
    middle = sizes[len(sizes) // 2]
    middle_configs = gin_config.parse_gin(tau_files[middle])
    naive_tokens = recipe.make_plan(middle_configs.model, middle_configs.recipe).tokens
    size_seeds = {(s, k): next(seeds) for k in range(max(design.tau_seeds, design.naive_seeds)) for s in sizes}
    runs += [DemoRun("tau", s, tau_files[s], (f"TrainConfig.seed = {size_seeds[s, k]}",), replica=k)
             for k in range(design.tau_seeds) for s in sizes]
    for k in range(design.naive_seeds):
        for s in sizes:
            files = (size_gin[s], recipe_files["naive"], eval_gin)
            n_params = recipe.params.count_params(gin_config.parse_gin(files).model)
            runs.append(DemoRun("naive", s, files, (f"RecipeConfig.tpp = {naive_tokens / n_params!r}",
                                                    f"TrainConfig.seed = {size_seeds[s, k]}"), replica=k))
    return runs


def run_demo(workdir: str, design: Design = DEFAULT, sizes: tuple[str, ...] | None = None, force_new: bool = False,
             gin_files: tuple[str, ...] = (), gin_params: tuple[str, ...] = (), log=print) -> dict:
    """Trains every run of the demo unless it is finished, then writes the report; returns report.json's content.
    `gin_files` and `gin_params` are layered on every run after its own (to try a variant of the whole demo)."""
    import time

    import jax

    from celerity_jax import demo_report, run

    if not jax.config.jax_compilation_cache_dir:
        # Seed repeats compile the same programs: a persistent cache in the workdir compiles each one once.
        jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, "jax_cache"))
    start = time.time()
    runs = [dataclasses.replace(r, gin_files=r.gin_files + tuple(gin_files),
                                gin_params=r.gin_params + tuple(gin_params)) for r in demo_runs(design, sizes)]
    loaded_runs = [run.load(run.RunSpec(r.workdir(workdir), r.gin_files, r.gin_params, name=r.name)) for r in runs]
    for loaded in loaded_runs:
        check_eval_grid(loaded)
    seconds = {}
    for r, loaded in zip(runs, loaded_runs):
        loaded.train_to(force_new=force_new, log=log)
        seconds[r.name] = loaded.train_seconds()
    downstream = score_downstream(workdir, [r for r in runs if r.group == "tau" and not r.replica], log) \
        if design.downstream else None
    return demo_report.write_report(workdir, runs, seconds, design=design.name,
                                    variant=tuple(gin_files) + tuple(gin_params), downstream=downstream,
                                    wall_seconds=time.time() - start)


def check_eval_grid(loaded) -> None:
    """Refuses, before anything trains, a run whose evals leave a bin of the report's t̂ grid empty (too few
    steps for the grid, as a small TPP or a large batch gives): its normalized curve would have a gap."""
    from celerity_jax.demo_report import GRID_BINS

    total = loaded.plan.steps
    steps = loaded.configs.train.all_eval_steps(total)
    filled = {min(GRID_BINS - 1, step * GRID_BINS // total) for step in steps}
    if len(filled) < GRID_BINS:
        raise ConfigError(f"{loaded.name}: {total} steps, evaluated at {len(steps)} of them, leave "
                          f"{GRID_BINS - len(filled)} of the report's {GRID_BINS} bins of t̂ empty; train more steps "
                          "(a larger RecipeConfig.tpp or a smaller RecipeConfig.batch_seqs)")


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
