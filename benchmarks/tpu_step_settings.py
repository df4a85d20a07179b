"""A run's train step compiled for a TPU slice under several activation settings: memory, XLA's estimate and
its FLOP count, and what windowed einsum does to the count. Compile-only, on any host with libtpu.

Each variant is `residual_dtype:rule:remat`, the rule being how the residual stream is split besides its batch
(`sharding.RESIDUAL_RULE`): "batch" (not at all), "seq" (the sequence over tensor) or "embed" (D over tensor).
For each it prints and writes as JSON XLA's bytes per chip and, with --estimates, the estimated step seconds,
MFU and XLA FLOPs ÷ model FLOPs (`aot.estimate`). With --windowed-einsum, the same gradient piece (one layer,
no remat) is compiled for each mesh with XLA:TPU's windowed einsum on and off: XLA FLOPs ÷ model FLOPs of a
layer, the loops in the program, and the time XLA's cost model gives.

    .venv/bin/python benchmarks/tpu_step_settings.py --gin-file experiments/tpu_calibration/maxtext_v5p_32b.gin \
        --topology v5p-128 --variants float32:batch:dots,bfloat16:seq:attention [--estimates] \
        [--windowed-einsum 1,16,4;64,1,1] [--windowed-rule seq] [--cache-dir DIR]
        [--out bench_out/tpu_step_settings.json]
"""

import argparse
import dataclasses
import platform
import time

import jax

from celerity_jax import gin_config
from celerity_jax.aot import estimate
from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import StepSetting, Target, compile_report
from celerity_jax.fileio import write_json_atomic
from celerity_jax.model import params, sharding

RULES = {"batch": (sharding.BATCH_AXES, None, None), "seq": (sharding.BATCH_AXES, "tensor", None),
         "embed": (sharding.BATCH_AXES, None, "tensor")}


def variant_row(gin_file: str, topology: str, variant: str, estimates: bool, cache: Cache) -> dict:
    residual, rule, remat = variant.split(":")
    sharding.RESIDUAL_RULE = RULES[rule]
    jax.clear_caches()  # the model's jitted functions were traced under the previous rule
    configs = gin_config.parse_gin([gin_file], [f"ModelConfig.residual_dtype = '{residual}'",
                                                f"ModelConfig.remat = '{remat}'"])
    start = time.time()
    report = compile_report(configs, topology, cache=cache, estimates="always" if estimates else "never")
    row = {"residual_dtype": residual, "rule": rule, "remat": remat, "mesh_shape": report["mesh_shape"],
           "gb_per_chip": report["bytes_per_chip"] / 1e9, "fits": report["fits"],
           "est_step_seconds": report["est_step_seconds"], "est_mfu": report["est_mfu"],
           "xla_over_model_flops": (report["xla_flops_per_step"] / report["model_flops_per_step"]
                                    if report["xla_flops_per_step"] else None),
           "seconds": round(time.time() - start, 1)}
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def windowed_einsum_row(gin_file: str, topology: str, mesh_shape: tuple[int, int, int], rule: str) -> dict:
    """XLA FLOPs ÷ model FLOPs of one layer's gradient, its windowed-einsum loops and XLA's time for it, with
    windowed einsum on (XLA's default) and off (how `aot.estimate` compiles), the residual stream split by `rule`."""
    sharding.RESIDUAL_RULE = RULES[rule]
    jax.clear_caches()
    configs = gin_config.parse_gin([gin_file], ["ModelConfig.remat = 'none'"])
    target = Target.of(configs, topology, StepSetting(mesh_shape, 1, "none", False))
    cfg, seq_len = target.run.model, target.plan.seq_len
    per_layer = {}
    for name, options in (("on", {}), ("off", estimate.COUNT_EVERY_FLOP)):
        cost = {}
        for n_layers in (1, 2):
            lowered = estimate._lower_gradient(dataclasses.replace(cfg, n_layers=n_layers), target.micro_seqs,
                                               seq_len, target.mesh, 0.0)
            compiled = lowered.compile(compiler_options=options)
            cost[n_layers] = dict(estimate.costs(compiled), loops=compiled.as_text().count("windowed_dot_general"))
        per_layer[name] = {k: cost[2][k] - cost[1][k] for k in ("flops", "optimal_seconds")}
        per_layer[name]["loops"] = cost[2]["loops"]
    # one layer's model FLOPs per chip: 6 × its parameters + the full L×L attention, as params.flops_per_token
    one, two = (params.flops_per_token(dataclasses.replace(cfg, n_layers=n), seq_len) for n in (1, 2))
    model = (two - one) * target.micro_seqs * seq_len / target.mesh.size
    row = {"mesh_shape": list(mesh_shape), "rule": rule}
    for name, cost in per_layer.items():
        row[f"xla_over_model_flops_{name}"] = cost["flops"] / model
        row[f"layer_seconds_{name}"] = cost["optimal_seconds"]
        row[f"windowed_loops_{name}"] = cost["loops"]
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin-file", dest="gin_file", required=True)
    parser.add_argument("--topology", required=True)
    parser.add_argument("--variants", default="", help="comma-separated residual_dtype:rule:remat")
    parser.add_argument("--estimates", action="store_true", help="also XLA's step-time estimate of each variant")
    parser.add_argument("--windowed-einsum", dest="windowed_einsum", default="",
                        help="semicolon-separated meshes, e.g. '1,16,4;64,1,1'")
    parser.add_argument("--windowed-rule", dest="windowed_rule", choices=tuple(RULES), default="seq",
                        help="how the residual stream is split in the windowed-einsum rows")
    parser.add_argument("--cache-dir", dest="cache_dir", default=None)
    parser.add_argument("--out", default="bench_out/tpu_step_settings.json")
    args = parser.parse_args()
    jax.config.update("jax_platforms", "cpu")
    cache = Cache(args.cache_dir)
    variants = [variant_row(args.gin_file, args.topology, v, args.estimates, cache)
                for v in args.variants.split(",") if v]
    windowed = [windowed_einsum_row(args.gin_file, args.topology, tuple(int(x) for x in mesh.split(",")),
                                    args.windowed_rule)
                for mesh in args.windowed_einsum.split(";") if mesh]
    write_json_atomic(args.out, {"gin_file": args.gin_file, "topology": args.topology, "host": platform.node(),
                                 "cpu": platform.processor() or platform.machine(), "jax": jax.__version__,
                                 "variants": variants, "windowed_einsum": windowed})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
