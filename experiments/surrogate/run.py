"""Fits the surrogate of the normalized curve (docs/science.md §5) to a grid of tiny runs: our Table 11.

    python experiments/surrogate/run.py [--grid regime|short_run] [--loss-curve eval|train] [--seed N]
        [--loss-curve train --write-default]

1. Trains every size × τ × TPP of the grid into --workdir: experiments/tiny/<size>.gin + the grid's gin, τ
   pinned and weight decay derived. The default grid, `regime` (grid.gin), trains every run in the short-run
   regime at one batch of 8 sequences; `short_run` (grid_short_run.gin, B = 1.5·sqrt(D)) is the first grid,
   whose runs are shorter than the regime, kept to reproduce results/short_run/. Finished runs are skipped,
   interrupted ones resume; each run's training time is in its run directory (timing.json).
2. Fits (b_c, b_e, q_c, q_e) on all runs and reports the MAE of every run over t̂ in [0.2, 1].
3. Held out: refits on the smallest size only (the paper's Table 11: fitted at 111M, applied to the
   larger sizes), without one size, and without one (τ, TPP) setting (a recipe no run of any size
   used), and scores the left-out runs.
   For scale: the oracle (b, q fitted to each curve alone), the same-controls run of the other
   size(s) as the prediction (what collapse offers without a surrogate), and the mean curve of the
   training runs (ignores τ and TPP).
   Fits the eval-loss curves by default (eval.csv: 8 held-out batches at 50 points of t̂), the training-loss
   curves with --loss-curve train.
4. Writes results.md, results.json and fit.png to --out (default results/, or results/train/ for training
   curves); with --write-default (training curves only) also the package's default surrogate
   (celerity_jax/collapse/default_surrogate.json, used by `--surrogate default`).
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys

import numpy as np

from celerity_jax.rundir import LOSS_CSV

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIT_RANGE = (0.2, 1.0)


@dataclasses.dataclass(frozen=True)
class Grid:
    gin: str       # beside this file
    tpps: str      # the default --tpps
    workdir: str   # the default --workdir, under runs/
    out: str       # the default --out, under results/ (train curves: its train/)


GRIDS = {"regime": Grid("grid.gin", "6,10,16", "surrogate_regime", ""),
         "short_run": Grid("grid_short_run.gin", "2,4,8", "surrogate", "short_run")}


@dataclasses.dataclass(frozen=True)
class GridRun:
    size: str
    tau: float
    tpp: float
    seed: int = 0
    grid_gin: str = GRIDS["regime"].gin

    @property
    def name(self) -> str:
        return f"{self.size}_tau{self.tau:g}_tpp{self.tpp:g}" + (f"_seed{self.seed}" if self.seed else "")

    @property
    def setting(self) -> tuple[float, float]:
        return self.tau, self.tpp

    def gin(self) -> tuple[list[str], list[str]]:
        files = [os.path.join(REPO, "experiments", "tiny", f"{self.size}.gin"), os.path.join(HERE, self.grid_gin)]
        return files, [f"RecipeConfig.tpp = {self.tpp!r}", f"RecipeConfig.tau = {self.tau!r}",
                       f"TrainConfig.seed = {self.seed}"]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grid", choices=tuple(GRIDS), default="regime",
                   help="regime: every run in the short-run regime (grid.gin); short_run: the first grid "
                        "(grid_short_run.gin)")
    p.add_argument("--workdir", default=None,
                   help="run directories (default: runs/surrogate_regime, or runs/surrogate for the short_run grid)")
    p.add_argument("--out", default=None,
                   help="results.md, results.json, fit.png (default: results/, or results/short_run/ for the "
                        "short_run grid; train/ below it for train curves)")
    p.add_argument("--sizes", default="d48,d64,d80", help="experiments/tiny/<size>.gin names")
    p.add_argument("--seed", type=int, default=0, help="TrainConfig.seed of every run (seed_floor.py: a second seed)")
    p.add_argument("--taus", default="0.1,0.3,1.0")
    p.add_argument("--tpps", default=None, help="default: 6,10,16 (regime grid), 2,4,8 (short_run grid)")
    p.add_argument("--loss-curve", choices=tuple(LOSS_CSV), default="eval",
                   help="fit the held-out eval curve (eval.csv) or the training-loss curve of each run")
    p.add_argument("--bins", type=int, default=None,
                   help="t̂ bins of the normalized curves (default: 50 for eval curves, one per eval; 100 for train)")
    p.add_argument("--smooth-bins", type=int, default=None,
                   help="moving-average width in bins (default: 1 for eval curves, 5 for train)")
    p.add_argument("--write-default", action="store_true",
                   help="also write the fit as the package's default surrogate")
    p.add_argument("--force-new", action="store_true",
                   help="archive run directories whose config changed (else such a run stops the script)")
    args = p.parse_args(argv)
    if args.write_default and args.loss_curve != "train":
        p.error("--write-default needs --loss-curve train: the default surrogate serves references of training "
                "curves")
    default_bins, default_smooth = (50, 1) if args.loss_curve == "eval" else (100, 5)
    args.bins = args.bins or default_bins
    args.smooth_bins = args.smooth_bins or default_smooth
    grid = GRIDS[args.grid]
    args.grid_gin = grid.gin
    args.tpps = args.tpps or grid.tpps
    args.workdir = args.workdir or os.path.join(REPO, "runs", grid.workdir)
    args.out = args.out or os.path.join(HERE, "results", *([grid.out] if grid.out else []),
                                        *(["train"] if args.loss_curve == "train" else []))
    return args


def grid_runs(args: argparse.Namespace) -> list[GridRun]:
    return [GridRun(size, tau, tpp, args.seed, args.grid_gin) for size in args.sizes.split(",") if size
            for tau in floats(args.taus) for tpp in floats(args.tpps)]


def train_grid(runs: list[GridRun], workdir: str, force_new: bool) -> dict[str, float | None]:
    """Trains what is not finished; returns each run's recorded training seconds (None if none)."""
    from celerity_jax import run

    seconds = {}
    for i, grid_run in enumerate(runs):
        files, params = grid_run.gin()
        name = f"[{i + 1}/{len(runs)}] {grid_run.name}"
        loaded = run.load(run.RunSpec(os.path.join(workdir, grid_run.name), tuple(files), tuple(params), name=name))
        summary = loaded.train_to(force_new=force_new)
        if summary is None:
            print(f"{name}: finished, skipped")
        elif summary["stopped"] != "finished":
            sys.exit(f"{grid_run.name} stopped ({summary['stopped']}); rerun to resume")
        seconds[grid_run.name] = loaded.train_seconds() or None
    return seconds


def mean_curve_mae(train_CxG: np.ndarray, test_CxG: np.ndarray, keep_G: np.ndarray) -> np.ndarray:
    """MAE of each test curve against the mean of the training curves."""
    return np.mean(np.abs(test_CxG[:, keep_G] - train_CxG.mean(axis=0)[keep_G]), axis=1)


def evaluate(runs: list[GridRun], inputs) -> dict:
    """The fit on all runs, the held-out refits and the comparison predictors, per run."""
    from celerity_jax.collapse import surrogate

    keep_G = (inputs.frac_G >= FIT_RANGE[0]) & (inputs.frac_G <= FIT_RANGE[1])
    sizes = np.array([r.size for r in runs])
    settings = [r.setting for r in runs]
    n = len(runs)
    full = surrogate.fit_surrogate(*inputs.arrays(), *FIT_RANGE)
    rows = [{"mae_fit_all": float(m)} for m in full.mae_C]

    first = sizes == sizes[0]  # the paper's Table 11: fitted at its smallest size, applied to the others
    smallest = surrogate.fit_surrogate(*inputs.take(first).arrays(), *FIT_RANGE)
    for i, m in enumerate(surrogate.mae_per_curve(smallest.constants, *inputs.arrays(), *FIT_RANGE)):
        rows[i]["mae_fit_smallest"] = float(m)

    held_out = {}
    for size in sorted(set(sizes), key=list(sizes).index):
        test = sizes == size
        fit = surrogate.fit_surrogate(*inputs.take(~test).arrays(), *FIT_RANGE)
        held_out[size] = dataclasses.asdict(fit.constants)
        mae = surrogate.mae_per_curve(fit.constants, *inputs.take(test).arrays(), *FIT_RANGE)
        blind = mean_curve_mae(inputs.curves_CxG[~test], inputs.curves_CxG[test], keep_G)
        for i, m, b in zip(np.flatnonzero(test), mae, blind):
            rows[i]["mae_held_out_size"] = float(m)
            rows[i]["mae_mean_curve_other_sizes"] = float(b)
    for setting in sorted(set(settings)):
        test = np.array([s == setting for s in settings])
        if test.all():
            continue
        fit = surrogate.fit_surrogate(*inputs.take(~test).arrays(), *FIT_RANGE)
        mae = surrogate.mae_per_curve(fit.constants, *inputs.take(test).arrays(), *FIT_RANGE)
        for i, m in zip(np.flatnonzero(test), mae):
            rows[i]["mae_held_out_setting"] = float(m)
    for i in range(n):
        oracle = surrogate.fit_surrogate(*inputs.take([i]).arrays(), *FIT_RANGE)
        rows[i].update(mae_oracle=float(oracle.mae), oracle_b=oracle.constants.b_c, oracle_q=oracle.constants.q_c)
        twins = [j for j in range(n) if settings[j] == settings[i] and sizes[j] != sizes[i]]
        if twins:
            rows[i]["mae_same_controls_other_size"] = float(
                mean_curve_mae(inputs.curves_CxG[twins], inputs.curves_CxG[[i]], keep_G)[0])
    return {"fit": full, "rows": rows, "held_out_size_constants": held_out}


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted changes" if dirty else "")


def machine() -> str:
    import jax
    return (f"{platform.machine()}, {os.cpu_count()} CPU cores, {jax.devices()[0].device_kind} "
            f"({jax.default_backend()}), python {platform.python_version()}, jax {jax.__version__}")


MAE_COLUMNS = (("mae_fit_all", "fit on all"), ("mae_fit_smallest", "fit on the smallest size"),
               ("mae_held_out_size", "size held out"),
               ("mae_held_out_setting", "(τ, TPP) held out"), ("mae_oracle", "oracle (b, q per curve)"),
               ("mae_same_controls_other_size", "other size, same τ and TPP"),
               ("mae_mean_curve_other_sizes", "mean curve of other sizes"))


def summarize(rows: list[dict], sizes: list[str]) -> dict:
    """Mean of every MAE column per size and overall."""
    def means(selected):
        return {k: float(np.mean([r[k] for r in selected if k in r])) for k, _ in MAE_COLUMNS
                if any(k in r for r in selected)}
    return {**{s: means([r for r in rows if r["size"] == s]) for s in sizes}, "all": means(rows)}


def write_markdown(path: str, result: dict) -> None:
    from celerity_jax import markdown
    from celerity_jax.fileio import write_text_atomic

    k, prov = result["constants"], result["provenance"]
    pct = lambda x: "–" if x is None else f"{100 * x:.2f}%"  # noqa: E731
    lines = [
        "# Surrogate fit on the tiny family (our counterpart of the paper's Table 11)", "",
        f"{prov['created']}; {prov['machine']}; commit {prov['commit']}.",
        f"Grid: sizes {', '.join(result['grid']['sizes'])} × τ {result['grid']['taus']} × TPP "
        f"{result['grid']['tpps']} ({len(result['runs'])} runs, one seed each, "
        f"{sum(r['train_s'] or 0 for r in result['runs']) / 60:.1f} min of training recorded); "
        f"{result['loss_curve']}-loss curves on {result['bins']} bins smoothed over {result['smooth_bins']}; "
        "MAE over t̂ in [0.2, 1].", "",
        f"Fitted on all runs: **b = {k['b_c']:.4g}·τ^{k['b_e']:.3f}, q = {k['q_c']:.4g}·TPP^{k['q_e']:.3f}** "
        f"(ε1 = 0.001, ε2 = 0.1, m = 0.05 fixed).", "",
        "## MAE per size", ""]
    rows = []
    for size in result["grid"]["sizes"] + ["all"]:
        runs = [r for r in result["runs"] if size in ("all", r["size"])]
        n_params = f"{runs[0]['n_params']:,}" if size != "all" else "–"
        rows.append([size, n_params, len(runs), *(pct(result["per_size"][size].get(key)) for key, _ in MAE_COLUMNS)])
    lines += markdown.table(["size", "N", "runs", *(label for _, label in MAE_COLUMNS)], rows)
    lines += ["", "Columns: *fit on all* — constants fitted on every run (in-sample); *fit on the smallest "
              "size* — fitted on the first size's runs only, as the paper fitted at 111M (in-sample for that "
              "size); *size held out* — "
              "fitted on the other size(s) only; *(τ, TPP) held out* — fitted without any run of that "
              "setting; *oracle* — b and q fitted to that curve alone (the floor of the functional form); "
              "*other size, same τ and TPP* — the other size's measured curve as the prediction; "
              "*mean curve of other sizes* — one curve for every τ and TPP.", "",
              "## Per run", ""]
    lines += markdown.table(
        ["run", "N", "τ", "TPP", "B (seqs)", "steps", "λ", "final loss", *(label for _, label in MAE_COLUMNS[:5]),
         "oracle b, q", "time (s)"],
        ([r["name"], f"{r['n_params']:,}", f"{r['tau']:g}", f"{r['tpp']:g}", r["batch_seqs"], r["steps"],
          f"{r['weight_decay']:.3g}", f"{r['final_loss']:.4f}", *(pct(r.get(key)) for key, _ in MAE_COLUMNS[:5]),
          f"{r['oracle_b']:.3g}, {r['oracle_q']:.3g}", "–" if r["train_s"] is None else f"{r['train_s']:.0f}"]
         for r in result["runs"]))
    lines += ["", "Constants fitted with one size held out: " + "; ".join(
        f"without {s}: b = {c['b_c']:.4g}·τ^{c['b_e']:.3f}, q = {c['q_c']:.4g}·TPP^{c['q_e']:.3f}"
        for s, c in result["held_out_size_constants"].items()) + ".", "", "![fit](fit.png)", ""]
    write_text_atomic(path, "\n".join(lines))


def plot(path: str, runs: list[GridRun], inputs, constants) -> None:
    """Measured (solid: first size, dotted: others) and fitted (dashed) curves, one panel per τ,
    with the residuals measured − fitted below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from celerity_jax.collapse import surrogate

    taus = sorted({r.tau for r in runs})
    tpps = sorted({r.tpp for r in runs})
    sizes = list(dict.fromkeys(r.size for r in runs))
    colors = dict(zip(tpps, plt.cm.viridis(np.linspace(0.0, 0.85, len(tpps)))))
    styles = dict(zip(sizes, ["-", ":", "-."] * len(sizes)))
    frac_G = inputs.frac_G
    shown_G = frac_G >= 0.1
    fig, axes = plt.subplots(2, len(taus), figsize=(4.2 * len(taus), 6.5), squeeze=False, sharex=True,
                             gridspec_kw={"height_ratios": [2, 1]})
    for col, tau in enumerate(taus):
        top, bottom = axes[0, col], axes[1, col]
        for i, run in enumerate(runs):
            if run.tau != tau:
                continue
            fitted_G = np.asarray(surrogate.surrogate_curve(frac_G, inputs.eta_CxG[i], inputs.eta_end_C[i],
                                                            constants.b(run.tau), constants.q(run.tpp)))
            label = f"{run.size} TPP {run.tpp:g}"
            top.plot(frac_G[shown_G], inputs.curves_CxG[i][shown_G], styles[run.size], color=colors[run.tpp],
                     label=label)
            if run.size == sizes[0]:
                top.plot(frac_G[shown_G], fitted_G[shown_G], "--", color=colors[run.tpp], lw=2, alpha=0.6,
                         label=f"surrogate TPP {run.tpp:g}")
            bottom.plot(frac_G[shown_G], (inputs.curves_CxG[i] - fitted_G)[shown_G], styles[run.size],
                        color=colors[run.tpp])
        top.set_title(f"τ = {tau:g}")
        top.axvline(FIT_RANGE[0], color="gray", lw=0.5)
        bottom.axvline(FIT_RANGE[0], color="gray", lw=0.5)
        bottom.axhline(0.0, color="black", lw=0.5)
        bottom.set_xlabel("t̂ = step / T")
        if col == 0:
            top.set_ylabel("L(t̂) / L(T)")
            bottom.set_ylabel("measured − surrogate")
            top.legend(fontsize=7, ncol=1)
    fig.suptitle("normalized training loss: measured vs the surrogate fitted on all runs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    from celerity_jax.collapse import curves, files, surrogate
    from celerity_jax.fileio import write_json_atomic

    sizes = [s for s in args.sizes.split(",") if s]
    runs = grid_runs(args)
    seconds = train_grid(runs, args.workdir, args.force_new)

    loaded = [files.load_curve(os.path.join(args.workdir, r.name), loss=args.loss_curve) for r in runs]
    inputs = surrogate.surrogate_inputs(loaded, args.bins, args.smooth_bins)
    evaluation = evaluate(runs, inputs)
    fit = evaluation["fit"]
    rows = []
    for run, curve, row in zip(runs, loaded, evaluation["rows"]):
        with open(os.path.join(args.workdir, run.name, "plan.json")) as f:
            plan = json.load(f)
        rows.append({"name": run.name, "size": run.size, "tau": run.tau, "tpp": run.tpp,
                     "n_params": plan["n_params"], "batch_seqs": plan["batch_seqs"], "steps": plan["steps"],
                     "weight_decay": plan["weight_decay"],
                     "final_loss": float(curves.normalize_run(curve, args.bins, args.smooth_bins)[1]),
                     "train_s": seconds[run.name], **row})

    os.makedirs(args.out, exist_ok=True)
    provenance = {
        "kind": "fit", "experiment": "experiments/surrogate/run.py", "loss_curve": args.loss_curve,
        "command": "python experiments/surrogate/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "commit": git_commit(),
        "gin_files": ["experiments/tiny/<size>.gin", f"experiments/surrogate/{args.grid_gin}"],
        "note": "fitted to tiny CPU runs (1e5-3e5 parameters, byte tokens); LLM-scale curves may differ"}
    result = {
        "format": "celerity-surrogate-experiment/1",
        "grid": {"name": args.grid, "sizes": sizes, "taus": floats(args.taus), "tpps": floats(args.tpps)},
        "loss_curve": args.loss_curve, "bins": args.bins, "smooth_bins": args.smooth_bins,
        "fit_range": list(FIT_RANGE),
        "constants": dataclasses.asdict(fit.constants), "mae": fit.mae,
        "per_size": summarize(rows, sizes), "held_out_size_constants": evaluation["held_out_size_constants"],
        "runs": rows, "provenance": provenance}
    write_json_atomic(os.path.join(args.out, "results.json"), result)
    write_markdown(os.path.join(args.out, "results.md"), result)
    plot(os.path.join(args.out, "fit.png"), runs, inputs, fit.constants)

    k = fit.constants
    print(f"\nb = {k.b_c:.4g}·τ^{k.b_e:.3f}   q = {k.q_c:.4g}·TPP^{k.q_e:.3f}")
    for size in sizes + ["all"]:
        m = result["per_size"][size]
        print(f"{size:4s} MAE: fit on all {100 * m['mae_fit_all']:.2f}%, size held out "
              f"{100 * m.get('mae_held_out_size', float('nan')):.2f}%, (τ, TPP) held out "
              f"{100 * m.get('mae_held_out_setting', float('nan')):.2f}%, fit on {sizes[0]} "
              f"{100 * m['mae_fit_smallest']:.2f}%, oracle {100 * m['mae_oracle']:.2f}%")
    print(f"wrote {args.out}/results.md, results.json, fit.png")
    if args.write_default:
        default_provenance = dict(provenance, results=os.path.relpath(os.path.join(args.out, "results.md"), REPO),
                                  mae_per_size={s: result["per_size"][s] for s in sizes + ["all"]},
                                  grid=result["grid"])
        info = [{"curve": os.path.relpath(os.path.join(args.workdir, r["name"]), REPO), "size": r["size"], "n_params": r["n_params"],
                 "tau": r["tau"], "tpp": r["tpp"]} for r in rows]
        files.save_surrogate(fit, info, FIT_RANGE, default_provenance, files.default_surrogate_path())
        print(f"wrote {files.default_surrogate_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
