"""Train-step throughput as a fraction of the machine's measured dense-matmul peak.

Measures the peak of a large dense matmul (float32 on CPU: the faster of XLA's and numpy's BLAS; bfloat16
on accelerators), then, per model shape, the trainer's jitted step (`train.step.build_step`: forward,
backward, AdamW/CompleteP update, collapse-monitor update, metrics). Prints tokens/s, model FLOP/s
(`params.flops_per_token`: 6N plus attention) and their fraction of the peak, compile time, peak memory and
host page faults per step; writes JSON. The overhead column: the real step over a minimal one built from
the same pieces (loss, gradient, update; no monitor, metrics or non-finite guard), plus the trainer's host
work at a log step (`train.log_step.StepLog.record`, without an eval); with XLA's bytes accessed by the real
step, the minimal one and the monitor update alone.

CPU speed-ups are on by default, as in the trainer; A/B switches: `--no-fast-dense` (ModelConfig.
dense_backward = "plain"), `--no-blocked-attention` (attention_impl = "xla"), `--no-mallopt`
(`celerity_jax.hostmem`; also CELERITY_RETAIN_HOST_MEMORY=0, per process, so compare two runs). `--levers`
times the first two as extra variants in the same interleaved rotation.

Shapes: "128", "256", "512" are the tiny byte-vocabulary ladder (4 layers) at that width with `--head-dim`
heads; "300m" is the celerity-300m preset at sequence 2048 (default on accelerators). Two phases per shape:
first the peak matmuls, the real step and its variants interleaved (the peak and each lever side by side);
then real and minimal steps alternating with nothing in between, as in training (the step and the
overhead). A step counts at its fastest repeat against the fastest matmul of the whole run, and, in
brackets, at its median against the median matmul of the first phase.

    .venv/bin/python benchmarks/train_throughput.py [--quick] [--sizes 128,256,512] [--seq-len 256]
        [--batch 16] [--steps 6] [--attention IMPL] [--levers] [--no-fast-dense] [--no-blocked-attention]
        [--no-mallopt] [--scan-layers] [--profile DIR] [--out bench_out/train_throughput.json]
"""

import argparse
import dataclasses
import io
import os
import platform
import resource
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from celerity_jax import hostmem, recipe, rundir
from celerity_jax.accelerators import host_cpu_name
from celerity_jax.collapse import monitor as monitor_lib
from celerity_jax.collapse.config import MonitorConfig
from celerity_jax.configs import RunConfigs, RunDefinition, TrainConfig
from celerity_jax.data.config import DataConfig
from celerity_jax.fileio import write_json_atomic
from celerity_jax.model import params as params_lib, presets, sharding, transformer
from celerity_jax.model.config import ATTENTION_IMPLS, ModelConfig
from celerity_jax.rundir.writers import CurveCSV, TensorBoardWriter
from celerity_jax.train import loop
from celerity_jax.train import step as step_lib
from celerity_jax.train.log_step import Measures, StepLog, Writers
from celerity_jax.train.progress import Progress

BIG_SEQ_LEN, BIG_BATCH = 2048, 16  # the 300m shape on an accelerator
LEVERS = {"fast_dense": {"dense_backward": "plain"}, "blocked_attention": {"attention_impl": "xla"}}  # "off" settings


def model_config(size: str, args) -> ModelConfig:
    overrides = {}
    for lever, off in LEVERS.items():
        if getattr(args, f"no_{lever}"):
            overrides.update(off)
    if args.scan_layers:
        overrides["scan_layers"] = True
    if args.attention:
        overrides["attention_impl"] = args.attention
    if size == "300m":
        overrides["scan_layers"] = True
        return presets.preset("celerity-300m", **overrides)
    d = int(size)
    return presets.preset("tiny-d128", d_model=d, n_heads=d // args.head_dim, head_dim=args.head_dim,
                          max_seq_len=args.seq_len, **overrides)


def minimal_step(model_cfg: ModelConfig, optimizer, state_sh, batch_sh):
    """Loss, gradient and optimizer update only: what the real step costs without monitor and metrics."""
    def loss_fn(params, batch):
        return transformer.next_token_loss(model_cfg, params, batch["inputs"], batch["targets"])[0]

    def train_step(state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return dataclasses.replace(state, step=state.step + 1, params=optax.apply_updates(state.params, updates),
                                   opt_state=opt_state), loss

    return jax.jit(train_step, donate_argnums=0, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, None))


def matmul_peak(n: int):
    """A jitted n×n matmul (float32 on CPU, bfloat16 with float32 accumulation elsewhere), and its FLOPs."""
    dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    a_NxN = jax.random.normal(jax.random.key(1), (n, n), dtype)
    b_NxN = jax.random.normal(jax.random.key(2), (n, n), dtype)
    # The product is written into a donated buffer, so timing it allocates and frees nothing on the host.
    f = jax.jit(lambda a, b, _: jnp.dot(a, b, preferred_element_type=jnp.float32), donate_argnums=2)
    out = [f(a_NxN, b_NxN, jnp.zeros((n, n), jnp.float32))]

    def run():
        out[0] = jax.block_until_ready(f(a_NxN, b_NxN, out[0]))

    return run, 2.0 * n**3


def numpy_matmul(n: int):
    """The same float32 matmul through numpy's BLAS (CPU): on some CPUs faster than XLA's, and then the
    machine's peak. Its idle BLAS threads spin for a while after a call, so rest before timing a step."""
    a_NxN = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    out_NxN = np.empty_like(a_NxN)

    def run():
        np.matmul(a_NxN, a_NxN, out=out_NxN)

    return run, 2.0 * n**3


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def host_peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def device_peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats()
    return stats.get("peak_bytes_in_use") if stats else None


def log_step_seconds(state, metrics, run: RunDefinition, log_every: int) -> float:
    """The trainer's host work at one log step: its divergence check (`train.loop`) and `StepLog.record`
    (fetch the pending losses and the metrics, compute the collapse metrics, write TensorBoard, curve.csv
    and the console line), without an eval. Median of 5, after a warm-up that compiles `monitor_metrics`."""
    reference_G = jnp.linspace(2.0, 1.0, run.configs.monitor.n_bins)  # any reference costs the same
    pending = [metrics["train/loss"]] * log_every
    with tempfile.TemporaryDirectory() as workdir:
        tb, curve = TensorBoardWriter(workdir), CurveCSV(os.path.join(workdir, rundir.CURVE_CSV), 0)
        progress = Progress(run.plan.steps, 0, stream=io.StringIO())
        step_log = StepLog(run, Writers(tb, curve), progress, 0, Measures(reference_G=reference_G))

        def once(step: int):
            loop.bad_step_counts(state)
            step_log.record(step, state, metrics, pending)

        once(log_every)
        times = [timed(lambda: once(log_every * (i + 2))) for i in range(5)]
        tb.close()
    return statistics.median(times)


def bench_shape(size: str, args, peak_fns: dict) -> dict:
    big = size == "300m"
    seq_len, batch_seqs = (BIG_SEQ_LEN, BIG_BATCH) if big else (args.seq_len, args.batch)
    cfg = model_config(size, args)
    run = RunDefinition.of(RunConfigs(cfg, recipe.RecipeConfig(tpp=20, seq_len=seq_len, batch_seqs=batch_seqs,
                                                               warmup_tokens=None),
                                      DataConfig(), TrainConfig(), MonitorConfig()))
    plan = run.plan
    build = step_lib.build_step(cfg, plan, run.configs.monitor, sharding.make_mesh((-1, 1, 1)), microbatches=1,
                                z_loss=0.0, seed=0)  # as the trainer builds it
    optimizer, state_sh, batch_sh = build.optimizer, build.state_shardings, build.batch_sharding
    tokens_BxL1 = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch_seqs, seq_len + 1), dtype=np.int32)
    batch = jax.device_put({"inputs": tokens_BxL1[:, :-1], "targets": tokens_BxL1[:, 1:]}, batch_sh)
    variants = {"real": build.train_step, "minimal": minimal_step(cfg, optimizer, state_sh, batch_sh)}
    if args.levers:  # the real step with one speed-up turned off (the optimizer and init do not change)
        for lever, off in LEVERS.items():
            if any(getattr(cfg, field) != value for field, value in off.items()):
                variants[f"no_{lever}"] = step_lib.make_train_step(
                    dataclasses.replace(cfg, **off), plan, optimizer, microbatches=1, z_loss=0.0,
                    state_shardings=state_sh, batch_sharding=batch_sh)

    runs = {}
    for name, jitted in variants.items():
        state = build.init()
        start = time.perf_counter()
        compiled = jitted.lower(state, batch).compile()
        compile_s = time.perf_counter() - start
        state, metrics = compiled(state, batch)  # warm up
        jax.block_until_ready(state)
        memory = compiled.memory_analysis()
        runs[name] = {"step": compiled, "state": state, "metrics": metrics, "times": [], "faults": 0.0,
                      "compile_s": compile_s, "temp_bytes": memory.temp_size_in_bytes if memory else None,
                      "bytes_accessed": (compiled.cost_analysis() or {}).get("bytes accessed")}

    # The collapse monitor's own share of the step's memory traffic: its update compiled alone.
    update_monitor = jax.jit(monitor_lib.monitor_update).lower(runs["real"]["state"].monitor, 0.0, 0.0).compile()
    monitor_bytes = (update_monitor.cost_analysis() or {}).get("bytes accessed")

    k = 1 if jax.default_backend() == "cpu" else 10  # steps per timed repeat: one sync per repeat

    def advance(run, n: int):
        for _ in range(n):
            run["state"], run["metrics"] = run["step"](run["state"], batch)
        jax.block_until_ready(run["state"])

    def run_steps(run, times: list):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times.append(timed(lambda: advance(run, k)) / k)
        run["faults"] += (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / k

    peak_times = {name: [] for name in peak_fns}
    for r in range(args.steps):
        for name, (matmul, _) in peak_fns.items():
            peak_times[name].append(min(timed(matmul) for _ in range(2)))
        if "numpy" in peak_fns:
            time.sleep(0.2)
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):  # alternate the order: none always first
            run_steps(runs[name], runs[name]["times"])
    pair_times = {"real": [], "minimal": []}
    for r in range(args.steps):
        for name in (("real", "minimal") if r % 2 == 0 else ("minimal", "real")):
            run_steps(runs[name], pair_times[name])
    if args.profile:
        with jax.profiler.trace(os.path.join(args.profile, f"d{cfg.d_model}")):
            advance(runs["real"], 3)
    log_s = log_step_seconds(runs["real"]["state"], runs["real"]["metrics"], run, args.log_every)

    peaks = {name: flops / min(peak_times[name]) for name, (_, flops) in peak_fns.items()}
    peak = max(peaks.values())
    peak_median = max(flops / statistics.median(peak_times[name]) for name, (_, flops) in peak_fns.items())
    tokens = batch_seqs * seq_len
    flops_per_step = params_lib.flops_per_token(cfg, seq_len) * tokens
    times = {name: run["times"] for name, run in runs.items()}
    step_s, step_median_s = min(pair_times["real"]), statistics.median(pair_times["real"])

    def paired(slow: str, fast: str, times=times) -> float:  # median over repeats of slow/fast − 1, side by side
        return statistics.median(a / b - 1.0 for a, b in zip(times[slow], times[fast]))

    in_graph = paired("real", "minimal", pair_times)
    logging = log_s / (args.log_every * step_s)
    return {
        "size": size, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size, "seq_len": seq_len, "batch_seqs": batch_seqs,
        "compute_dtype": str(jnp.dtype(cfg.dtype)), "attention_kernel": cfg.attention_kernel,
        "dense_backward_kernel": cfg.dense_backward_kernel, "scan_layers": cfg.scan_layers,
        "n_params": params_lib.count_params(cfg), "flops_per_token": params_lib.flops_per_token(cfg, seq_len),
        "step_s": step_s, "step_median_s": step_median_s, "step_times_s": pair_times["real"],
        "interleaved_step_times_s": times,
        "tokens_per_s": tokens / step_s, "tokens_per_s_median": tokens / step_median_s,
        "model_flops_per_s": flops_per_step / step_s, "row_peak_flops_per_s": peak,
        **{f"matmul_{name}_flops_per_s": value for name, value in peaks.items()},
        "frac_of_peak_median": flops_per_step / step_median_s / peak_median,
        "compile_s": runs["real"]["compile_s"], "xla_temp_bytes": runs["real"]["temp_bytes"],
        "peak_memory_bytes": host_peak_rss_bytes() if jax.default_backend() == "cpu" else device_peak_bytes(),
        "peak_memory_kind": ("host RSS (process, so far)" if jax.default_backend() == "cpu"
                             else "device peak_bytes_in_use"),
        "page_faults_per_step": runs["real"]["faults"] / (2 * args.steps),
        "minimal_step_s": min(pair_times["minimal"]), "minimal_step_median_s": statistics.median(pair_times["minimal"]),
        "minimal_step_times_s": pair_times["minimal"],
        "overhead_in_graph": in_graph,
        "overhead_bytes_accessed": (runs["real"]["bytes_accessed"] / runs["minimal"]["bytes_accessed"] - 1.0
                                    if runs["real"]["bytes_accessed"] and runs["minimal"]["bytes_accessed"] else None),
        "monitor_bytes_fraction": (monitor_bytes / runs["real"]["bytes_accessed"]
                                   if monitor_bytes and runs["real"]["bytes_accessed"] else None),
        "log_step_s": log_s, "log_every": args.log_every, "overhead_logging": logging,
        "overhead": in_graph + logging,
        "levers": {name[3:]: {"step_s": min(times[name]), "step_s_with": min(times["real"]),
                              "slowdown_if_off": min(times[name]) / min(times["real"]) - 1.0,
                              "slowdown_if_off_paired_median": paired(name, "real")}
                   for name in runs if name.startswith("no_")},
    }



def print_rows(rows: list[dict], peak: float, args, cpu: bool) -> None:
    """The table (adding each row's fraction of the machine's peak), then what its columns mean."""
    print(f"peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'shape':>24s} {'tokens/s':>9s} {'step ms':>8s} {'GFLOP/s':>8s} {'frac':>6s} {'(median)':>8s} "
          f"{'compile s':>9s} {'mem MiB':>8s} {'faults':>7s} {'overhead':>8s} {'(graph+log)':>13s}")
    for row in rows:
        row["peak_flops_per_s"] = peak
        row["frac_of_peak"] = row["model_flops_per_s"] / peak
        shape = (f"d{row['d_model']}x{row['n_layers']} h{row['n_heads']}x{row['head_dim']} "
                 f"{row['batch_seqs']}x{row['seq_len']}")
        print(f"{shape:>24s} {row['tokens_per_s']:9.0f} {1e3 * row['step_s']:8.1f} "
              f"{row['model_flops_per_s'] / 1e9:8.1f} "
              f"{100 * row['frac_of_peak']:5.1f}% {100 * row['frac_of_peak_median']:7.1f}% "
              f"{row['compile_s']:9.1f} {row['peak_memory_bytes'] / 2**20:8.0f} "
              f"{row['page_faults_per_step']:7.0f} {100 * row['overhead']:7.1f}% "
              f"({100 * row['overhead_in_graph']:+.1f}+{100 * row['overhead_logging']:.2f})")
        if row["overhead_bytes_accessed"] is not None and row["monitor_bytes_fraction"] is not None:
            print(f"{'':>24s} XLA bytes accessed: real step {100 * row['overhead_bytes_accessed']:+.1f}% over the "
                  f"minimal one; the monitor update alone {row['monitor_bytes_fraction']:.1e} of the real step's")
        for lever, effect in row["levers"].items():
            print(f"{'':>24s} without {lever}: step {1e3 * effect['step_s']:.1f} ms against "
                  f"{1e3 * effect['step_s_with']:.1f} ms with it in the same rotation, "
                  f"{100 * effect['slowdown_if_off']:+.1f}% "
                  f"(paired median {100 * effect['slowdown_if_off_paired_median']:+.1f}%)")
    print(f"fastest of {args.steps} back-to-back steps against the fastest matmul of the run (in brackets: median "
          "step against the median matmul); levers: timed in the interleaved rotation; overhead: real step over a "
          "minimal one (loss, gradient, update) as the median of paired repeats, plus the host work of a log step "
          f"every {args.log_every} steps; faults: host page faults per step; mem: "
          f"{'peak host RSS of the process so far' if cpu else 'device peak'}; "
          f"load average now {os.getloadavg()[0]:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None,
                        help="comma-separated: 128, 256, 512 (tiny ladder widths) and/or 300m "
                             "(default 128,256,512, plus 300m on an accelerator; --quick: 128,256)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (the ladder shapes)")
    parser.add_argument("--head-dim", type=int, default=64, help="head size of the ladder shapes")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per variant (default 6; --quick 3)")
    parser.add_argument("--quick", action="store_true", help="a smoke run in about a minute")
    parser.add_argument("--log-every", type=int, default=TrainConfig.log_every,
                        help="steps per log step, for the logging overhead (default: TrainConfig's)")
    parser.add_argument("--levers", action="store_true",
                        help="also time the step with each CPU speed-up turned off, in the same rotation")
    parser.add_argument("--no-fast-dense", action="store_true",
                        help="ModelConfig.dense_backward = 'plain' (XLA's own Dense backward)")
    parser.add_argument("--no-blocked-attention", action="store_true",
                        help="ModelConfig.attention_impl = 'xla' (jax.nn.dot_product_attention)")
    parser.add_argument("--attention", choices=ATTENTION_IMPLS, default=None,
                        help="ModelConfig.attention_impl for every shape (default: the config's 'auto')")
    parser.add_argument("--no-mallopt", action="store_true",
                        help="leave glibc's allocator as it is (see celerity_jax/hostmem.py)")
    parser.add_argument("--scan-layers", action="store_true",
                        help="ModelConfig.scan_layers = True for the ladder shapes (the 300m shape always scans)")
    parser.add_argument("--profile", default="",
                        help="also write a jax.profiler trace of 3 real steps per shape under this folder "
                             "(open it with TensorBoard's profile plugin or xprof)")
    parser.add_argument("--out", default="bench_out/train_throughput.json")
    args = parser.parse_args()
    if args.attention and args.no_blocked_attention:
        parser.error("--attention and --no-blocked-attention both set attention_impl; give one")
    host_memory = (hostmem.HostMemory({}, "turned off by --no-mallopt") if args.no_mallopt
                   else hostmem.retain_freed_memory())  # before JAX allocates anything
    cpu = jax.default_backend() == "cpu"
    if args.sizes is None:
        args.sizes = "128,256" if args.quick else ("128,256,512" if cpu else "128,256,512,300m")
    if args.steps is None:
        args.steps = 3 if args.quick else 6
    if args.quick:
        args.batch = min(args.batch, 8)

    n = 2048 if cpu else 8192
    machine = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
               "devices": jax.device_count(), "cpu": host_cpu_name(), "cpu_count": os.cpu_count(),
               "host": platform.node(), "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
               "host_memory": dataclasses.asdict(host_memory),
               "peak_matmul": f"{n}x{n} {'float32' if cpu else 'bfloat16'}"}
    peak_fns = {"xla": matmul_peak(n)}
    if cpu:
        peak_fns["numpy"] = numpy_matmul(n)
    print(f"{machine['backend']} ({machine['device']}, {machine['cpu']}, {machine['cpu_count']} cores), "
          f"jax {machine['jax']}, load average {os.getloadavg()[0]:.1f}; peak: the faster {machine['peak_matmul']} "
          f"matmul of {' and '.join(peak_fns)}; glibc retains freed memory: "
          f"{'yes' if host_memory.applied else 'no (' + host_memory.reason + ')'}")
    start_peak = max(flops / min(timed(matmul) for _ in range(5)) for matmul, flops in peak_fns.values())
    rows = [bench_shape(size.strip(), args, peak_fns) for size in args.sizes.split(",")]
    # The machine's peak: the fastest matmul seen in the whole run, so a busy moment cannot lower it.
    peak = max([start_peak] + [row["row_peak_flops_per_s"] for row in rows])
    print_rows(rows, peak, args, cpu)
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} exceeds the {os.cpu_count()} cores; timings are noisy")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json_atomic(args.out, {"machine": machine, "peak_flops_per_s": peak, "load_average": load,
                                 "args": vars(args), "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
