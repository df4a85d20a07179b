"""Overhead of the in-loop collapse monitor on a jitted, train-like step (target: <= 1% of step time).

Times a small MLP regression step (forward, backward, Adam-like update, donated state) with and without
`monitor_update` inside it, interleaving the two so machine load hits both alike and keeping the fastest
repeat of each; also the device cost
of monitor_update alone (many updates in one jitted loop) and of one `monitor_metrics` call (made only at
log steps). Then the collapse figure that the trainer draws with a reference (`train.log_step.FIGURE_TAG`:
`monitor_curve`, the matplotlib PNG and its TensorBoard write) at most FIGURE_POINTS + 1 times per run, as a
share of a whole run: of the MLP steps, and of the tiny presets (experiments/tiny: the trainer's real step,
timed, times the plan's steps). Prints tables and writes JSON.

    python benchmarks/monitor_overhead.py [--out bench_out/monitor_overhead.json]
"""

import argparse
import glob
import os
import platform
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax import gin_config, recipe
from celerity_jax.collapse import curves, image, monitor
from celerity_jax.collapse.config import MonitorConfig
from celerity_jax.fileio import write_json_atomic
from celerity_jax.model import sharding
from celerity_jax.rundir.writers import TensorBoardWriter
from celerity_jax.train import step as step_lib
from celerity_jax.train.log_step import FIGURE_POINTS, FIGURE_TAG

TINY_PRESETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments", "tiny", "d*.gin")
FIGURES_PER_RUN = FIGURE_POINTS + 1  # one per 5% of t̂, and the last step when it falls between two
BUDGET = 0.01


def make_step(d: int, hidden: int, with_monitor: bool):
    def loss_fn(params, x_BxD):
        h_BxH = jax.nn.relu(x_BxD @ params["w1_DxH"])
        return jnp.mean((h_BxH @ params["w2_HxD"] - x_BxD)**2)

    def step(state, x_BxD):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], x_BxD)
        moments = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, state["moments"], grads)
        params = jax.tree.map(lambda p, m: p - 1e-3 * m, state["params"], moments)
        new = dict(state, params=params, moments=moments, step=state["step"] + 1)
        if with_monitor:
            new["monitor"] = monitor.monitor_update(state["monitor"], loss, new["step"] / 100_000)
        return new, loss

    return jax.jit(step, donate_argnums=0)


def init_state(d: int, hidden: int, cfg: MonitorConfig):
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1_DxH": jax.random.normal(k1, (d, hidden)) / d**0.5,
              "w2_HxD": jax.random.normal(k2, (hidden, d)) / hidden**0.5}
    return {"params": params, "moments": jax.tree.map(jnp.zeros_like, params), "step": jnp.zeros([], jnp.int32),
            "monitor": monitor.monitor_init(cfg)}


def time_steps(step, state, x_BxD, n: int):
    start = time.perf_counter()
    for _ in range(n):
        state, loss = step(state, x_BxD)
    loss.block_until_ready()
    return state, (time.perf_counter() - start) / n


def measure(d: int, hidden: int, batch: int, cfg: MonitorConfig, steps: int, repeats: int) -> dict:
    x_BxD = jax.random.normal(jax.random.key(1), (batch, d))
    runs = {}
    for with_monitor in (False, True):
        step = make_step(d, hidden, with_monitor)
        state, _ = time_steps(step, init_state(d, hidden, cfg), x_BxD, 3)  # compile and warm up
        runs[with_monitor] = [step, state, []]
    for r in range(repeats):
        for run in (runs[r % 2 == 0], runs[r % 2 == 1]):  # ABBA order: no variant always goes first
            run[1], seconds = time_steps(run[0], run[1], x_BxD, steps)
            run[2].append(seconds)
    base, with_monitor = (min(runs[k][2]) for k in (False, True))  # min: least disturbed by other load
    return {"d": d, "hidden": hidden, "batch": batch, "step_s": base, "step_with_monitor_s": with_monitor,
            "measured_overhead": with_monitor / base - 1.0}


def monitor_costs(cfg: MonitorConfig, n: int = 10_000) -> dict:
    @jax.jit
    def many_updates(state):
        return jax.lax.fori_loop(0, n, lambda i, s: monitor.monitor_update(s, 2.0 + i * 1e-5, i / n), state)

    state = monitor.monitor_init(cfg)
    jax.block_until_ready(many_updates(state))
    start = time.perf_counter()
    state = jax.block_until_ready(many_updates(state))
    update_s = (time.perf_counter() - start) / n
    mean_G, _ = curves.smooth(state["loss_sum"], state["count"], cfg.smooth_bins)
    reference_G = curves.normalize(mean_G, mean_G[-1])
    jax.block_until_ready(monitor.monitor_metrics(state, reference_G, cfg))
    start = time.perf_counter()
    for _ in range(100):
        metrics = monitor.monitor_metrics(state, reference_G, cfg)
    jax.block_until_ready(metrics)
    return {"update_s": update_s, "metrics_call_s": (time.perf_counter() - start) / 100}


def figure_seconds(cfg: MonitorConfig, repeats: int) -> float:
    """One collapse figure at the end of a run, as the trainer makes it: the aligned curve, the PNG and its
    TensorBoard write. The median over repeats: the figure is host work, paid at its typical cost."""
    frac_T = np.arange(1, 20_001) / 20_000
    loss_T = (2.0 + np.exp(-5.0 * frac_T)) * (1.0 + 0.01 * np.random.default_rng(0).standard_normal(frac_T.size))
    sum_G, count_G = curves.bin_curve(frac_T, loss_T, cfg.n_bins)
    mean_G, _ = curves.smooth(sum_G, count_G, cfg.smooth_bins)
    reference_G = curves.normalize(mean_G, mean_G[-1])
    state = {"loss_sum": sum_G, "count": count_G}
    values = jax.device_get(monitor.monitor_metrics(state, reference_G, cfg))
    frac_G = curves.bin_centers(cfg.n_bins)
    with tempfile.TemporaryDirectory() as logdir:
        tb = TensorBoardWriter(logdir)

        def once():
            normalized_G = jax.device_get(monitor.monitor_curve(state, reference_G, cfg))
            png = image.collapse_figure(frac_G, normalized_G, jax.device_get(reference_G), 1.0,
                                        float(values["collapse/pred_final_loss"]),
                                        float(values["collapse/pred_final_loss_err"]))
            tb.image(0, FIGURE_TAG, png)
            tb.flush()

        once()  # compiles monitor_curve, loads matplotlib's fonts
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            once()
            times.append(time.perf_counter() - start)
        tb.close()
    return statistics.median(times)


def preset_run(gin_path: str, repeats: int, figure_repeats: int) -> dict:
    """A tiny preset's training time (the trainer's real step, fastest of `repeats`, times the plan's steps) and
    its collapse figures' share of it."""
    configs = gin_config.parse_gin([gin_path])
    plan = recipe.make_plan(configs.model, configs.recipe)
    build = step_lib.build_step(configs.model, plan, configs.monitor, sharding.make_mesh((-1, 1, 1)),
                                microbatches=configs.train.microbatches, z_loss=configs.train.z_loss, seed=0)
    tokens_BxL1 = np.random.default_rng(0).integers(0, configs.model.vocab_size, (plan.batch_seqs, plan.seq_len + 1),
                                                    dtype=np.int32)
    batch = jax.device_put({"inputs": tokens_BxL1[:, :-1], "targets": tokens_BxL1[:, 1:]}, build.batch_sharding)
    state = jax.block_until_ready(build.train_step(build.init(), batch)[0])  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state = jax.block_until_ready(build.train_step(state, batch)[0])
        times.append(time.perf_counter() - start)
    run_s = plan.steps * min(times)
    figure_s = figure_seconds(configs.monitor, figure_repeats)
    return {"preset": os.path.basename(gin_path)[:-len(".gin")], "steps": plan.steps, "step_s": min(times),
            "run_s": run_s, "n_bins": configs.monitor.n_bins, "figure_s": figure_s,
            "figure_share": FIGURES_PER_RUN * figure_s / run_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_out/monitor_overhead.json")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10, help="steps between monitor_metrics calls")
    parser.add_argument("--figure-repeats", type=int, default=10, help="timed collapse figures per grid")
    parser.add_argument("--preset-repeats", type=int, default=5, help="timed steps per tiny preset")
    args = parser.parse_args()
    cfg = MonitorConfig()
    costs = monitor_costs(cfg)
    rows = [measure(d, h, b, cfg, args.steps, args.repeats) for d, h, b in ((128, 512, 64), (256, 1024, 256))]
    figure_s = figure_seconds(cfg, args.figure_repeats)
    for row in rows:
        row["update_share"] = costs["update_s"] / row["step_s"]
        row["metrics_share"] = costs["metrics_call_s"] / (args.log_every * row["step_s"])
        row["figure_min_run_steps"] = FIGURES_PER_RUN * figure_s / (BUDGET * row["step_s"])
    presets = [preset_run(path, args.preset_repeats, args.figure_repeats) for path in sorted(glob.glob(TINY_PRESETS))]
    figure_min_run_s = FIGURES_PER_RUN * figure_s / BUDGET
    result = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "host": platform.node(),
              "cpu_count": os.cpu_count(), "n_bins": cfg.n_bins, "log_every": args.log_every, **costs,
              "figure_s": figure_s, "figures_per_run": FIGURES_PER_RUN, "figure_min_run_s": figure_min_run_s,
              "rows": rows, "tiny_presets": presets}
    print(f"backend {result['backend']} ({result['device']}), {cfg.n_bins} bins")
    print(f"monitor_update: {1e6 * costs['update_s']:.3f} µs per step inside a jitted loop; "
          f"monitor_metrics: {1e3 * costs['metrics_call_s']:.3f} ms per call (every {args.log_every} steps)")
    print(f"{'MLP d×hidden, batch':>22s} {'step ms':>9s} {'+monitor ms':>12s} {'measured':>9s} "
          f"{'update':>8s} {'metrics':>8s} {'figures ≤ 1% from':>18s}")
    for row in rows:
        print(f"{row['d']:>9d}×{row['hidden']:<5d}, {row['batch']:>5d} {1e3 * row['step_s']:9.3f} "
              f"{1e3 * row['step_with_monitor_s']:12.3f} {100 * row['measured_overhead']:8.2f}% "
              f"{100 * row['update_share']:7.3f}% {100 * row['metrics_share']:7.3f}% "
              f"{row['figure_min_run_steps']:>12,.0f} steps")
    print("measured: with/without monitor_update in the step (noisy on a loaded machine); update/metrics: "
          "their own cost as a share of the step (metrics amortized over the log interval)")
    print(f"collapse figure ({FIGURE_TAG}): {1e3 * figure_s:.1f} ms each at {cfg.n_bins} bins; "
          f"{FIGURES_PER_RUN} per run stay within {100 * BUDGET:.0f}% of runs that train ≥ {figure_min_run_s:.0f} s")
    print(f"{'tiny preset':>12s} {'steps':>6s} {'step ms':>8s} {'run s':>7s} {'bins':>5s} {'figure ms':>10s} "
          f"{'figures':>8s}")
    for p in presets:
        print(f"{p['preset']:>12s} {p['steps']:6d} {1e3 * p['step_s']:8.1f} {p['run_s']:7.1f} {p['n_bins']:5d} "
              f"{1e3 * p['figure_s']:10.1f} {100 * p['figure_share']:7.2f}%")
    print(f"figures: {FIGURES_PER_RUN} collapse figures as a share of the preset's training time (all its steps)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json_atomic(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
