"""A mixture of experts' train step with expert parallelism and without: ModelConfig.expert_parallel True (the
experts split over fsdp, each chip's tokens sent to their experts and back by all-to-all) against False (every
chip runs every expert on its own tokens, the expert weights gathered like a dense MLP's).

For each mode, the step compiled for this host's devices and, with --topology, for a TPU slice (compile-only,
libtpu): the collectives of the compiled program (how many of each kind, and the bytes of their results on one
chip), XLA's memory analysis, XLA's FLOPs per chip against the model's (`params.flops_per_token`, active
parameters), on TPU XLA's estimated step seconds, and on this host, unless --no-timing, the step's time (the
fastest of --repeats). Prints a line per mode and program, and writes JSON.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/moe_dispatch.py \
        [--gin-file experiments/tiny/d112.gin] [--gin-param BINDING ...] [--topology v5p-8] [--no-timing] \
        [--repeats 5] [--out benchmarks/results/cpu/moe_dispatch.json]

The gin bindings come after MOE's, so they can change the mixture, the batch or the mesh. The TPU programs are
compiled as `aot.estimate` compiles its pieces (windowed einsum off), so that each gather is a collective of its
own and XLA's FLOPs count every matmul. XLA counts a loop's body once: keep the step loop-free (one microbatch,
unscanned layers, whole logits) for its counts to be the step's.
"""

import argparse
import platform
import re
import time

import jax
import numpy as np

from celerity_jax import gin_config, recipe
from celerity_jax.aot import estimate
from celerity_jax.aot.compile import StepSetting, Target
from celerity_jax.fileio import write_json_atomic
from celerity_jax.model import sharding
from celerity_jax.train import memory, step as step_lib

# 8 experts, top-2, over an all-fsdp mesh: one expert per chip of 8 CPU devices, two per chip of a v5p-8 (4 chips)
MOE = ["ModelConfig.n_experts = 8", "ModelConfig.router = 'topk'", "ModelConfig.experts_per_token = 2",
       "ModelConfig.n_layers = 4", "RecipeConfig.seq_len = 256", "RecipeConfig.batch_seqs = 64",
       "TrainConfig.mesh_shape = (1, -1, 1)", "TrainConfig.microbatches = 1"]
COLLECTIVES = ("all-to-all", "all-gather", "reduce-scatter", "all-reduce", "collective-permute")
# an instruction's result shape and its collective; asynchronous collectives are read at their "-done"
_COLLECTIVE = re.compile(r"^\s*(?:ROOT )?%?\S+ = (\(.*?\)|\S+) (" + "|".join(COLLECTIVES) + r")(?:-done)?\(")
_ARRAY = re.compile(r"\b(pred|bf16|[fsu]\d+)\[([\d,]*)\]")


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """Per kind of collective in a compiled program's text: how many there are and the bytes of their results
    on one chip (a loop's body counted once; XLA:TPU writes a reduce-scatter as an all-reduce and a slice, which
    count as the all-reduce)."""
    out = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    for line in hlo_text.splitlines():
        found = _COLLECTIVE.match(line)
        if found:
            shape, kind = found.groups()
            out[kind]["count"] += 1
            out[kind]["bytes"] += sum(_itemsize(dtype) * int(np.prod([int(d) for d in dims.split(",") if d]))
                                      for dtype, dims in _ARRAY.findall(shape))
    return out


def _itemsize(dtype: str) -> int:
    return {"pred": 1, "bf16": 2}.get(dtype) or int(dtype[1:]) // 8


def measure(build, plan, options: dict, timing: bool, repeats: int) -> dict:
    """The compiled step's collectives, memory and costs; with `timing`, its fastest time on this host."""
    with jax.set_mesh(build.mesh):
        lowered = build.train_step.lower(*build.abstract_inputs(plan.batch_seqs, plan.seq_len))
    start = time.perf_counter()
    compiled = lowered.compile(compiler_options=options)
    m = compiled.memory_analysis()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    on_tpu = build.mesh.devices.flat[0].platform == "tpu"
    chips = build.mesh.size
    row = {"compile_seconds": round(time.perf_counter() - start, 1), "collectives": collectives(compiled.as_text()),
           "bytes_per_chip": memory.bytes_per_chip(compiled),
           "memory": {k: getattr(m, f"{k}_size_in_bytes") for k in ("argument", "output", "alias", "temp")},
           "xla_flops_per_chip": float(analysis.get("flops", 0.0)),
           "model_flops_per_chip": plan.flops_per_token * plan.batch_tokens / chips,
           "est_step_seconds": (estimate.costs(compiled) or {}).get("optimal_seconds") if on_tpu else None}
    if timing:
        row["step_seconds"] = _fastest_step(build, compiled, plan, repeats)
    return row


def _fastest_step(build, compiled, plan, repeats: int) -> float:
    tokens = jax.random.randint(jax.random.key(0), (plan.batch_seqs, plan.seq_len), 0, build.model_cfg.vocab_size)
    batch = jax.device_put({"inputs": tokens, "targets": tokens}, build.batch_sharding)
    state, _ = compiled(build.init(), batch)  # a first step, untimed
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - start)
    return min(times)


def host_build(configs):
    plan = recipe.make_plan(configs.model, configs.recipe)
    mesh = sharding.make_mesh(configs.train.mesh_shape)
    build = step_lib.build_step(configs.model, plan, configs.monitor, mesh, microbatches=configs.train.microbatches,
                                z_loss=configs.train.z_loss, seed=configs.train.seed)
    return build, plan


def slice_build(configs, topology: str):
    target = Target.of(configs, topology, StepSetting.of(configs))
    return target.build(), target.plan


def _line(mode: str, where: str, row: dict) -> str:
    moved = ", ".join(f"{kind} {c['count']}× {c['bytes'] / 1e6:.2f} MB" for kind, c in row["collectives"].items()
                      if c["count"])
    est = f", XLA est {row['est_step_seconds'] * 1e3:.3f} ms" if row["est_step_seconds"] else ""
    timed = f", step {row['step_seconds'] * 1e3:.1f} ms" if "step_seconds" in row else ""
    flops = row["xla_flops_per_chip"] / row["model_flops_per_chip"]
    return (f"{mode:<15} {where:<6} {row['bytes_per_chip'] / 1e6:8.1f} MB/chip (temp "
            f"{row['memory']['temp'] / 1e6:.1f}), XLA FLOPs / model {flops:.2f}{est}{timed}; "
            f"{moved or 'no collectives'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin-file", dest="gin_file", default="experiments/tiny/d112.gin")
    parser.add_argument("--gin-param", dest="gin_param", action="append", default=[])
    parser.add_argument("--topology", default=None, help="also compile for this TPU slice, e.g. v5p-8")
    parser.add_argument("--no-timing", dest="timing", action="store_false", help="compile only; time nothing")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/cpu/moe_dispatch.json")
    args = parser.parse_args()
    jax.config.update("jax_platforms", "cpu")
    rows = []
    for parallel in (True, False):
        mode = "expert-parallel" if parallel else "dense-dispatch"
        configs = gin_config.parse_gin([args.gin_file], MOE + args.gin_param +
                                       [f"ModelConfig.expert_parallel = {parallel}"])
        programs = {jax.default_backend(): (host_build(configs), {}, args.timing)}
        if args.topology:
            programs[args.topology] = (slice_build(configs, args.topology), estimate.COUNT_EVERY_FLOP, False)
        for where, ((build, plan), options, timing) in programs.items():
            row = {"mode": mode, "expert_parallel": parallel, "devices": where,
                   "mesh_shape": [build.mesh.shape[a] for a in sharding.MESH_AXES],
                   **measure(build, plan, options, timing, args.repeats)}
            print(_line(mode, where, row), flush=True)
            rows.append(row)
    write_json_atomic(args.out, {"gin_file": args.gin_file, "gin_params": MOE + args.gin_param,
                                 "host": platform.node(), "cpu": platform.processor() or platform.machine(),
                                 "jax": jax.__version__, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
