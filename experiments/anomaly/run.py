"""Anomaly detection: does the collapse residual see a bad restart before the raw loss does?

The paper's diagnostic at tiny scale. The tiny family (experiments/tiny d48/d64/d80) is trained under
the tau recipe at 2 TPP (experiments/demo/tau.gin, anomaly.gin), 5 seeds per size. One run
(FAULT_SIZE, seed FAULT_SEED) stops at t̂ = INJECT_FRAC and is restarted into new run directories with
`TrainConfig.init_from` and a wrong weight decay (λ × each of WD_FACTORS): a realistic bad restart. Then

- the in-loop collapse alert (`collapse/alert`, the family's MonitorConfig from base.gin, or eval.gin's
  with --loss-curve eval) against a reference built from the OTHER seeds of the same size, read from
  TensorBoard and replayed on curve.csv (eval.csv, one log per eval) with `monitor.replay_monitor` (the two
  must agree);
- the raw-loss detector `collapse.detectors.zscore_detector` (fixed ZScoreConfig defaults);

give their onset t̂ (first alert) on the faulted runs, and their false alarms on all clean runs
(leave-one-seed-out references; a second, paper-style reference from the other sizes is reported too).

    .venv/bin/python experiments/anomaly/run.py [--workdir runs/anomaly] [--out experiments/anomaly]
        [--loss-curve eval]

`--loss-curve eval` runs it all again with the monitor on the eval curve (anomaly/eval.gin; references built
from eval curves; the raw z-score still reads the training loss), into runs/anomaly_eval and
experiments/anomaly/eval by default.

Reads the tiny/demo gin files as they are now, so a retuned family is rerun with the same command.
Rerunning skips finished runs and resumes unfinished ones (a run directory of another config, after the
family's gin files changed, is refused); results.md, results.json and anomaly.png go to --out, with the
training time of every run (each run directory's timing.json).
"""

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from celerity_jax import gin_config, markdown, recipe, run  # noqa: E402
from celerity_jax.collapse import detectors, files, monitor, reference  # noqa: E402
from celerity_jax.configs import RunConfigs  # noqa: E402
from celerity_jax.fileio import write_json_atomic, write_text_atomic  # noqa: E402
from celerity_jax.rundir import LOSS_CSV  # noqa: E402

SIZES = ("d48", "d64", "d80")
SEEDS = (0, 1, 2, 3, 4)
FAULT_SIZE, FAULT_SEED = "d80", 0  # the largest member, as the paper's 1.8B
INJECT_FRAC = 0.5
WD_FACTORS = (10.0, 3.0)
ZSCORE = detectors.ZScoreConfig()


def gin_files(size: str, loss_curve: str) -> list[str]:
    exp = os.path.join(ROOT, "experiments")
    return [os.path.join(exp, "tiny", f"{size}.gin"), os.path.join(exp, "demo", "tau.gin"),
            os.path.join(exp, "anomaly", "anomaly.gin"),
            *([os.path.join(exp, "anomaly", "eval.gin")] if loss_curve == "eval" else [])]


def parse(size: str, loss_curve: str) -> RunConfigs:
    return gin_config.parse_gin(gin_files(size, loss_curve), [])


def clean_dir(workdir: str, size: str, seed: int) -> str:
    return os.path.join(workdir, "clean", size, f"seed{seed}")


def fault_name(factor: float) -> str:
    return f"wd_x{factor:g}"


def fault_dir(workdir: str, fault_size: str, factor: float) -> str:
    return os.path.join(workdir, "fault", f"{fault_size}_seed{FAULT_SEED}_{fault_name(factor)}")


def train(runs: dict, size: str, loss_curve: str, params: list[str], run_dir: str, workdir: str,
          until: int | None = None) -> None:
    """Trains (or resumes) a run up to step `until` (default: its end) unless it is there already; keeps
    the run in `runs` by its name (its directory relative to `workdir`)."""
    name = os.path.relpath(run_dir, workdir)
    runs[name] = run.load(run.RunSpec(run_dir, tuple(gin_files(size, loss_curve)), tuple(params), name=name))
    runs[name].train_to(until)


def build_reference(run_dirs: list[str], path: str, monitor_cfg) -> str:
    curves = [files.load_curve(d, loss=monitor_cfg.loss_curve) for d in run_dirs]
    ref = reference.reference_from_curves(curves, monitor_cfg.n_bins, monitor_cfg.smooth_bins)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.save_reference(ref, path)
    return path


def seed_reference(workdir: str, size: str, seed: int, monitor_cfg) -> str:
    """Leave-one-seed-out: the reference of `size` built from its other seeds."""
    others = [clean_dir(workdir, size, s) for s in SEEDS if s != seed]
    return build_reference(others, os.path.join(workdir, "refs", f"{size}_without_seed{seed}.json"), monitor_cfg)


def size_references(workdir: str, sizes: tuple[str, ...], size: str, monitor_cfg) -> list[str]:
    """Paper-style: references of the OTHER sizes (all seeds each); family-aware at the run's N."""
    return [build_reference([clean_dir(workdir, s, k) for k in SEEDS],
                            os.path.join(workdir, "refs", f"{s}_all_seeds.json"), monitor_cfg)
            for s in sizes if s != size]


def first_frac(flags, frac) -> float | None:
    i = detectors.first_true(flags)
    return None if i < 0 else float(np.asarray(frac)[i])


def analyse(run_dir: str, ref_paths: list[str], monitor_cfg, log_every: int, force: bool) -> dict:
    """Collapse alert (replayed on the monitor's curve: curve.csv, or eval.csv with one log per eval) and raw
    z-score detector (on the training loss) of one run."""
    followed, curve = files.load_curve(run_dir, loss=monitor_cfg.loss_curve), files.load_curve(run_dir)
    ref_G, notes = reference.reference_on_grid(ref_paths, monitor_cfg, curve.controls, run_dir, force=force)
    log_every = log_every if monitor_cfg.loss_curve == "train" else 1
    logs = {k: np.asarray(v) for k, v in
            monitor.replay_monitor(followed.frac_T, followed.loss_T, ref_G, monitor_cfg, log_every).items()}
    alert_L = logs["collapse/alert"] > 0
    ratio_L = np.abs(logs["collapse/residual"]) / logs["collapse/residual_sigma"]
    raw = {k: np.asarray(v) for k, v in detectors.zscore_detector(curve.loss_T, ZSCORE).items()}
    return {
        "collapse_onset": first_frac(alert_L, logs["frac"]),
        "collapse_alert_logs": int(alert_L.sum()),
        "max_abs_residual_over_sigma": float(np.nanmax(ratio_L)),
        "raw_onset": first_frac(raw["alert"], curve.frac_T),
        "raw_alert_steps": int(raw["alert"].sum()),
        "max_z": float(np.nanmax(raw["z"])),
        "final_loss": float(np.mean(curve.loss_T[-20:])),
        "reference_notes": [n.replace(ROOT + os.sep, "") for n in notes],
        "_logs": logs, "_raw": raw, "_curve": curve, "_ref_G": np.asarray(ref_G),
    }


def in_loop_alerts(run_dir: str, replay_logs: dict, total: int, start_step: int) -> dict:
    """The collapse metrics the run logged to TensorBoard, against the replay at the same steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)}
              for tag in ("collapse/alert", "collapse/residual")}
    replay_steps = np.rint(replay_logs["frac"] * total).astype(int)
    common = [(i, s) for i, s in enumerate(replay_steps) if s > start_step and s in logged["collapse/alert"]]
    alerts = {s: v for s, v in sorted(logged["collapse/alert"].items())}
    first = next((s for s, v in alerts.items() if v > 0), None)
    residual_diff = [abs(logged["collapse/residual"][s] - replay_logs["collapse/residual"][i]) for i, s in common
                     if np.isfinite(logged["collapse/residual"][s])]
    return {
        "collapse_onset_in_loop": None if first is None else first / total,
        "logs_compared": len(common),
        "alert_agreement": sum(int(logged["collapse/alert"][s] > 0) == int(replay_logs["collapse/alert"][i] > 0)
                               for i, s in common),
        "max_residual_diff": float(max(residual_diff)) if residual_diff else None,
    }


def plot(path: str, faults: dict, clean: dict, inject_frac: float, monitor_cfg, fault_size: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    runs = {"clean (same seed)": (clean, "k")}
    runs.update({name: (r, c) for (name, r), c in zip(faults.items(), ("tab:red", "tab:orange", "tab:purple"))})
    frac_G = (np.arange(len(clean["_ref_G"])) + 0.5) / len(clean["_ref_G"])
    axes[0].plot(frac_G, clean["_ref_G"], color="tab:blue", lw=2.5, alpha=0.5, label="reference (other seeds)")
    for name, (r, color) in runs.items():
        logs = r["_logs"]
        axes[0].plot(logs["frac"], logs["collapse/normalized_loss"], color=color, lw=1, label=name)
        axes[1].plot(logs["frac"], logs["collapse/residual"] / logs["collapse/residual_sigma"], color=color, lw=1,
                     label=name)
        axes[2].plot(r["_curve"].frac_T, r["_raw"]["z"], color=color, lw=1, label=name)
        for ax, onset in ((axes[1], r["collapse_onset"]), (axes[2], r["raw_onset"])):
            if onset is not None:
                ax.axvline(onset, color=color, ls=":", lw=1.5)
    for sign in (-1, 1):
        axes[1].axhline(sign * monitor_cfg.alert_k, color="gray", ls="--", lw=1)
    axes[2].axhline(ZSCORE.k, color="gray", ls="--", lw=1, label=f"k = {ZSCORE.k:g}")
    titles = ("normalized loss l(t̂) (in-loop early-align divisor)",
              f"collapse residual r/σ (alert: beyond ±{monitor_cfg.alert_k:g} for {monitor_cfg.alert_m} bins); "
              "dotted: onset",
              f"raw detector: z of the EMA loss (alert: > {ZSCORE.k:g} for {ZSCORE.m} steps); dotted: onset")
    for ax, title in zip(axes, titles):
        ax.axvline(inject_frac, color="gray", lw=1)
        ax.set_xlabel("t̂ = step / T")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylim(0.95, 1.4)
    axes[1].set_ylim(-8, 20)
    axes[2].set_ylim(-8, 8)
    fig.suptitle(f"{fault_size} seed {FAULT_SEED} restarted at t̂ = {inject_frac:.3f} with a wrong weight decay "
                 "(gray line); references from the other seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(x, spec=".3f") -> str:
    return "none" if x is None else format(x, spec)


def write_results(out: str, summary: dict, faults: dict, clean_rows: list[dict]) -> None:
    c = summary["config"]
    lines = [
        "# Anomaly detection: collapse alert vs raw-loss z-score", "",
        f"Written {summary['date']} on {summary['machine']}; `{summary['command']}` "
        f"({summary['train_seconds']:.0f} s of training).", "",
        f"Family: tiny {', '.join(c['sizes'])} (tau recipe, quick budget: "
        f"{', '.join(f'{s} {n} steps' for s, n in c['steps'].items())}), seeds "
        f"{c['seeds']}. Fault: {c['fault_size']} seed {FAULT_SEED} stopped at step {c['inject_step']} "
        f"(t̂ = {c['inject_frac_actual']:.3f}) and restarted into a new directory (`TrainConfig.init_from`) "
        f"with weight decay λ × factor (planned λ = {c['weight_decay']:.4g}, τ = {c['tau']:.3g}).", "",
        f"Collapse alert: MonitorConfig of the family (n_bins {c['monitor']['n_bins']}, smooth_bins "
        f"{c['monitor']['smooth_bins']}, alert_k {c['monitor']['alert_k']:g}, alert_m {c['monitor']['alert_m']}, "
        f"align_window {tuple(c['monitor']['align_window'])}), logged every {c['log_every']} steps"
        f"{' (replayed once per eval, on the eval curve)' if c['monitor']['loss_curve'] == 'eval' else ''}. "
        "Raw detector: "
        f"EMA decay {ZSCORE.ema_decay:g}, W = {ZSCORE.window} steps, k = {ZSCORE.k:g}, m = {ZSCORE.m} steps.", "",
        "## Faulted runs (onset t̂ = first alert)", ""]
    lines += markdown.table(
        ["fault", "λ", f"final loss (clean: {summary['clean_fault_seed_final']:.4f})", "collapse alert, in-loop",
         "collapse alert, replay", "collapse alert, other-size ref", "raw z-score", "in-loop vs replay"],
        ([name, f"{r['weight_decay']:.4g}", f"{r['final_loss']:.4f}", fmt(r["collapse_onset_in_loop"]),
          fmt(r["collapse_onset"]), fmt(r["size_ref"].get("collapse_onset")), fmt(r["raw_onset"]),
          f"{r['alert_agreement']}/{r['logs_compared']} logs agree, max Δr {fmt(r['max_residual_diff'], '.1e')}"]
         for name, r in faults.items()))
    notes = sorted({n for r in faults.values() for n in r["reference_notes"]})
    lines += ["", f"Injection at t̂ = {c['inject_frac_actual']:.3f}. 'none' = no alert before the end. Final loss: "
              "mean of the last 20 steps. The monitor's start-up check refused the reference for the faulted runs "
              "(their plan's τ changed with λ); they ran with `TrainConfig.force_reference = True` so that the "
              "curve-based alert could be measured:", ""] + [f"- {n}" for n in notes] + ["",
              "## Clean runs (false alarms)", "",
              "Collapse alert against the same size's other seeds (leave-one-seed-out) and against the other "
              "sizes (all seeds, family-aware curve at the run's N); raw detector on the run's own loss.", ""]
    lines += markdown.table(
        ["size", "seed", "collapse alert onset (LOSO)", "alert logs", "max abs(r)/σ", "onset, other-size ref",
         "raw onset", "raw alert steps", "max z"],
        ([r["size"], r["seed"], fmt(r["collapse_onset"]), r["collapse_alert_logs"],
          f"{r['max_abs_residual_over_sigma']:.2f}", fmt(r["size_ref"].get("collapse_onset")), fmt(r["raw_onset"]),
          r["raw_alert_steps"], f"{r['max_z']:.2f}"] for r in clean_rows))
    fa = summary["false_alarms"]
    lines += ["", f"False alarms on {fa['runs']} clean runs: collapse alert (LOSO) {fa['collapse_loso']}, collapse alert "
                  f"(other-size ref) {fa['collapse_other_sizes']}, raw z-score {fa['raw']}.", "",
              "![anomaly](anomaly.png)", ""]
    write_text_atomic(os.path.join(out, "results.md"), "\n".join(lines))


def public(r: dict) -> dict:
    return {k: (public(v) if isinstance(v, dict) else v) for k, v in r.items() if not k.startswith("_")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loss-curve", choices=tuple(LOSS_CSV), default="train",
                        help="the curve the collapse monitor follows (eval: experiments/anomaly/eval.gin)")
    parser.add_argument("--workdir", default=None, help="default runs/anomaly (runs/anomaly_eval for eval)")
    parser.add_argument("--out", default=None, help="default experiments/anomaly (its eval/ folder for eval)")
    parser.add_argument("--sizes", default=",".join(SIZES), help="for quick checks: fewer sizes (comma-separated)")
    parser.add_argument("--fault-size", default=FAULT_SIZE)
    args = parser.parse_args(argv)
    eval_curve, loss_curve = args.loss_curve == "eval", args.loss_curve
    args.workdir = args.workdir or os.path.join(ROOT, "runs", "anomaly_eval" if eval_curve else "anomaly")
    args.out = args.out or os.path.join(ROOT, "experiments", "anomaly", *(["eval"] if eval_curve else []))
    workdir, sizes, fault_size = os.path.abspath(args.workdir), tuple(args.sizes.split(",")), args.fault_size
    if fault_size not in sizes:
        parser.error(f"--fault-size {fault_size} is not among --sizes {args.sizes}")

    base = {s: parse(s, loss_curve) for s in sizes}
    plans = {s: recipe.make_plan(c.model, c.recipe) for s, c in base.items()}
    monitor_cfg, log_every = base[fault_size].monitor, base[fault_size].train.log_every
    total = plans[fault_size].steps
    inject_step = round(INJECT_FRAC * total)

    runs = {}
    for seed in SEEDS:
        for size in sizes:
            until = inject_step if (size, seed) == (fault_size, FAULT_SEED) else None
            train(runs, size, loss_curve, [f"TrainConfig.seed = {seed}"], clean_dir(workdir, size, seed), workdir,
                  until)
    fault_ref = seed_reference(workdir, fault_size, FAULT_SEED, monitor_cfg)
    source = os.path.join(clean_dir(workdir, fault_size, FAULT_SEED), "checkpoints", str(inject_step))
    fault_params = {}
    for factor in WD_FACTORS:
        wd = factor * plans[fault_size].weight_decay
        fault_params[factor] = wd
        restart = [f"TrainConfig.seed = {FAULT_SEED}", f"TrainConfig.init_from = '{source}'",
                   f"RecipeConfig.weight_decay = {wd!r}", f"TrainConfig.collapse_reference = ('{fault_ref}',)",
                   # the plan's τ changed with λ, so the reference's controls no longer match
                   "TrainConfig.force_reference = True"]
        train(runs, fault_size, loss_curve, restart, fault_dir(workdir, fault_size, factor), workdir)
    train(runs, fault_size, loss_curve, [f"TrainConfig.seed = {FAULT_SEED}"],
          clean_dir(workdir, fault_size, FAULT_SEED), workdir)

    print("\n== analysis", flush=True)
    clean_rows, clean_fault_seed = [], None
    for size in sizes:
        others = size_references(workdir, sizes, size, monitor_cfg)
        for seed in SEEDS:
            run_dir = clean_dir(workdir, size, seed)
            row = analyse(run_dir, [seed_reference(workdir, size, seed, monitor_cfg)], monitor_cfg, log_every, False)
            row["size_ref"] = public(analyse(run_dir, others, monitor_cfg, log_every, False)) if others else {}
            row.update(size=size, seed=seed)
            clean_rows.append(row)
            if (size, seed) == (fault_size, FAULT_SEED):
                clean_fault_seed = row
    fault_ref = seed_reference(workdir, fault_size, FAULT_SEED, monitor_cfg)
    faults = {}
    for factor, wd in fault_params.items():
        run_dir = fault_dir(workdir, fault_size, factor)
        r = analyse(run_dir, [fault_ref], monitor_cfg, log_every, True)
        others = size_references(workdir, sizes, fault_size, monitor_cfg)
        r["size_ref"] = public(analyse(run_dir, others, monitor_cfg, log_every, True)) if others else {}
        r.update(in_loop_alerts(run_dir, r["_logs"], total, inject_step), weight_decay=wd, factor=factor)
        faults[fault_name(factor)] = r

    plan, timings = plans[fault_size], {name: r.train_seconds() for name, r in runs.items()}
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "command": " ".join(["python experiments/anomaly/run.py", *(argv if argv is not None else sys.argv[1:])]),
        "train_seconds": sum(timings.values()), "timings_s": timings,
        "config": {"sizes": list(sizes), "seeds": list(SEEDS), "steps": {s: p.steps for s, p in plans.items()},
                   "fault_size": fault_size, "fault_seed": FAULT_SEED, "inject_frac": INJECT_FRAC,
                   "inject_step": inject_step, "inject_frac_actual": inject_step / total,
                   "weight_decay": plan.weight_decay, "tau": plan.tau, "wd_factors": list(WD_FACTORS),
                   "monitor": json.loads(json.dumps(monitor_cfg.__dict__)), "log_every": log_every,
                   "zscore": ZSCORE.__dict__,
                   "gin_files": [os.path.relpath(f, ROOT) for f in gin_files("<size>", loss_curve)]},
        "clean_fault_seed_final": clean_fault_seed["final_loss"],
        "faults": {k: public(v) for k, v in faults.items()},
        "clean": [public(r) for r in clean_rows],
        "false_alarms": {"runs": len(clean_rows),
                         "collapse_loso": sum(r["collapse_onset"] is not None for r in clean_rows),
                         "collapse_other_sizes": sum(r["size_ref"].get("collapse_onset") is not None for r in clean_rows),
                         "raw": sum(r["raw_onset"] is not None for r in clean_rows)},
    }
    os.makedirs(args.out, exist_ok=True)
    plot(os.path.join(args.out, "anomaly.png"), faults, clean_fault_seed, inject_step / total, monitor_cfg, fault_size)
    write_json_atomic(os.path.join(args.out, "results.json"), summary)
    write_results(args.out, summary, faults, clean_rows)
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
