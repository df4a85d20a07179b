"""Train-step throughput as a fraction of the machine's measured dense-matmul peak.

In one run: the peak of a large dense matmul (float32 on CPU: the faster of XLA's and numpy's BLAS;
bfloat16 on accelerators), then, for each model shape, the trainer's real jitted step
(`celerity_jax.train.step.make_train_step`: forward, backward, the AdamW/CompleteP update, the
collapse-monitor update and the metrics). Prints tokens/s,
model FLOP/s (`params.flops_per_token`: 6N plus attention), their fraction of the peak, compile time
and peak memory, and writes JSON. It also times a minimal step built from the same pieces (loss,
gradient, optimizer update; no monitor, no metrics, no non-finite guard) to give the in-loop overhead.

Shapes: "128", "256", "512" are the tiny byte-vocabulary ladder (4 layers) at that width with
`--head-dim` heads; "300m" is the celerity-300m preset at sequence 2048 (default on accelerators).
Steps and peak matmuls are interleaved and the fastest repeat is kept (least disturbed by other load);
medians are reported too.

    .venv/bin/python benchmarks/train_throughput.py [--quick] [--sizes 128,256,512] [--seq-len 256]
        [--batch 16] [--steps 6] [--out bench_out/train_throughput.json]
"""

import argparse
import dataclasses
import os
import platform
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from celerity_jax import optim, recipe, sharding
from celerity_jax.collapse.monitor import MonitorConfig
from celerity_jax.fileio import write_json_atomic
from celerity_jax.model import completep, params as params_lib, presets, transformer
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.loss import cross_entropy
from celerity_jax.train import step as step_lib

BIG_SEQ_LEN, BIG_BATCH = 2048, 16  # the 300m shape on an accelerator


def model_config(size: str, seq_len: int, head_dim: int) -> ModelConfig:
    if size == "300m":
        overrides = {"scan_layers": True}
        if jax.default_backend() == "gpu":
            overrides["attention_impl"] = "cudnn"
        return presets.preset("celerity-300m", **overrides)
    d = int(size)
    return presets.preset("tiny-d128", d_model=d, n_heads=d // head_dim, head_dim=head_dim, max_seq_len=seq_len)


def minimal_step(model_cfg: ModelConfig, optimizer, state_sh, batch_sh):
    """Loss, gradient and optimizer update only: what the real step costs without monitor and metrics."""
    def loss_fn(params, batch):
        return cross_entropy(transformer.apply(model_cfg, params, batch["inputs"]), batch["targets"])[0]

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
    f = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    jax.block_until_ready(f(a_NxN, b_NxN))
    return (lambda: jax.block_until_ready(f(a_NxN, b_NxN))), 2.0 * n**3


def numpy_matmul(n: int):
    """The same float32 matmul through numpy's BLAS (CPU): on some CPUs faster than XLA's, and then the
    machine's peak. Its idle BLAS threads spin for a while after a call, so rest before timing a step."""
    a_NxN = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)

    def run():
        a_NxN @ a_NxN

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


def bench_shape(size: str, args, peak_fns: dict) -> dict:
    big = size == "300m"
    seq_len, batch_seqs = (BIG_SEQ_LEN, BIG_BATCH) if big else (args.seq_len, args.batch)
    cfg = model_config(size, seq_len, args.head_dim)
    plan = recipe.make_plan(cfg, recipe.RecipeConfig(tpp=20, seq_len=seq_len, batch_seqs=batch_seqs,
                                                     warmup_tokens=None))
    rng = jax.random.key(0)
    optimizer = optim.build_optimizer(plan, completep.multipliers(
        cfg, jax.eval_shape(lambda: transformer.init_params(cfg, rng))))
    mesh = sharding.make_mesh((-1, 1, 1))
    batch_sh = sharding.batch_sharding(mesh)
    init = lambda: step_lib.init_state(cfg, optimizer, MonitorConfig(), rng)
    state_sh = step_lib.state_shardings(jax.eval_shape(init), mesh, optimizer)
    tokens_BxL1 = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch_seqs, seq_len + 1), dtype=np.int32)
    batch = jax.device_put({"inputs": tokens_BxL1[:, :-1], "targets": tokens_BxL1[:, 1:]}, batch_sh)

    runs = {}
    for name, jitted in (("real", step_lib.make_train_step(cfg, plan, optimizer, microbatches=1, z_loss=0.0,
                                                           state_shardings=state_sh, batch_sharding=batch_sh)),
                         ("minimal", minimal_step(cfg, optimizer, state_sh, batch_sh))):
        state = jax.jit(init, out_shardings=state_sh)()
        start = time.perf_counter()
        compiled = jitted.lower(state, batch).compile()
        compile_s = time.perf_counter() - start
        state, _ = compiled(state, batch)  # warm up
        jax.block_until_ready(state)
        memory = compiled.memory_analysis()
        runs[name] = {"step": compiled, "state": state, "times": [], "compile_s": compile_s,
                      "temp_bytes": memory.temp_size_in_bytes if memory else None,
                      "bytes_accessed": (compiled.cost_analysis() or {}).get("bytes accessed")}

    k = 1 if jax.default_backend() == "cpu" else 10  # steps per timed repeat: one sync per repeat

    def run_steps(run):
        def go():
            for _ in range(k):
                run["state"], _ = run["step"](run["state"], batch)
            jax.block_until_ready(run["state"])
        run["times"].append(timed(go) / k)

    peak_times = {name: [] for name in peak_fns}
    for r in range(args.steps):
        for name, (matmul, _) in peak_fns.items():
            peak_times[name].append(min(timed(matmul) for _ in range(2)))
        if "numpy" in peak_fns:
            time.sleep(0.2)
        for name in (("real", "minimal") if r % 2 == 0 else ("minimal", "real")):  # ABBA: neither always first
            run_steps(runs[name])

    peaks = {name: flops / min(peak_times[name]) for name, (_, flops) in peak_fns.items()}
    peak = max(peaks.values())
    peak_median = max(flops / statistics.median(peak_times[name]) for name, (_, flops) in peak_fns.items())
    tokens = batch_seqs * seq_len
    flops_per_step = params_lib.flops_per_token(cfg, seq_len) * tokens
    real, minimal = runs["real"]["times"], runs["minimal"]["times"]
    step_s, step_median_s = min(real), statistics.median(real)
    return {
        "size": size, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size, "seq_len": seq_len, "batch_seqs": batch_seqs,
        "compute_dtype": str(jnp.dtype(cfg.dtype)), "n_params": params_lib.count_params(cfg),
        "flops_per_token": params_lib.flops_per_token(cfg, seq_len),
        "step_s": step_s, "step_median_s": step_median_s,
        "tokens_per_s": tokens / step_s, "tokens_per_s_median": tokens / step_median_s,
        "model_flops_per_s": flops_per_step / step_s, "peak_flops_per_s": peak,
        **{f"matmul_{name}_flops_per_s": value for name, value in peaks.items()},
        "frac_of_peak": flops_per_step / step_s / peak,
        "frac_of_peak_median": flops_per_step / step_median_s / peak_median,
        "compile_s": runs["real"]["compile_s"], "xla_temp_bytes": runs["real"]["temp_bytes"],
        "peak_memory_bytes": host_peak_rss_bytes() if jax.default_backend() == "cpu" else device_peak_bytes(),
        "peak_memory_kind": "host RSS (process)" if jax.default_backend() == "cpu" else "device peak_bytes_in_use",
        "minimal_step_s": min(minimal), "minimal_step_median_s": statistics.median(minimal),
        "overhead": min(real) / min(minimal) - 1.0,
        "overhead_paired_median": statistics.median(a / b - 1.0 for a, b in zip(real, minimal)),
        "overhead_bytes_accessed": (runs["real"]["bytes_accessed"] / runs["minimal"]["bytes_accessed"] - 1.0
                                    if runs["real"]["bytes_accessed"] and runs["minimal"]["bytes_accessed"] else None),
    }


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


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
    parser.add_argument("--out", default="bench_out/train_throughput.json")
    args = parser.parse_args()
    cpu = jax.default_backend() == "cpu"
    if args.sizes is None:
        args.sizes = "128,256" if args.quick else ("128,256,512" if cpu else "128,256,512,300m")
    if args.steps is None:
        args.steps = 3 if args.quick else 6
    if args.quick:
        args.batch = min(args.batch, 8)

    n = 2048 if cpu else 8192
    machine = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
               "devices": jax.device_count(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
               "host": platform.node(), "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
               "peak_matmul": f"{n}x{n} {'float32' if cpu else 'bfloat16'}"}
    peak_fns = {"xla": matmul_peak(n)}
    if cpu:
        peak_fns["numpy"] = numpy_matmul(n)
    print(f"{machine['backend']} ({machine['device']}, {machine['cpu']}, {machine['cpu_count']} cores), "
          f"jax {machine['jax']}, load average {os.getloadavg()[0]:.1f}; peak: the faster {machine['peak_matmul']} "
          f"matmul of {' and '.join(peak_fns)}")
    rows = []
    for size in args.sizes.split(","):
        rows.append(bench_shape(size.strip(), args, peak_fns))
        row = rows[-1]
        if len(rows) == 1:
            print(f"{'shape':>24s} {'tokens/s':>9s} {'step ms':>8s} {'GFLOP/s':>8s} {'peak':>7s} {'frac':>6s} "
                  f"{'(median)':>8s} {'compile s':>9s} {'mem MiB':>8s} {'overhead':>8s}")
        shape = f"d{row['d_model']}x{row['n_layers']} h{row['n_heads']}x{row['head_dim']} {row['batch_seqs']}x{row['seq_len']}"
        print(f"{shape:>24s} {row['tokens_per_s']:9.0f} {1e3 * row['step_s']:8.1f} "
              f"{row['model_flops_per_s'] / 1e9:8.1f} {row['peak_flops_per_s'] / 1e9:7.1f} "
              f"{100 * row['frac_of_peak']:5.1f}% {100 * row['frac_of_peak_median']:7.1f}% "
              f"{row['compile_s']:9.1f} {row['peak_memory_bytes'] / 2**20:8.0f} "
              f"{100 * row['overhead_paired_median']:7.1f}%")
    load = os.getloadavg()[0]
    print(f"fastest of {args.steps} steps (median in brackets) against the fastest peak matmul; overhead: real step "
          f"over a minimal one (loss, gradient, update) as the median of paired repeats; load average now {load:.1f}")
    if load > (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} exceeds the {os.cpu_count()} cores; timings are noisy")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json_atomic(args.out, {"machine": machine, "load_average": load, "args": vars(args), "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
