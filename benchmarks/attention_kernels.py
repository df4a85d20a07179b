"""Flash attention (ModelConfig.attention_impl = 'flash') against XLA's attention on this machine's backend.

For each sequence length: forward and backward of causal attention with ALiBi in bf16 (and float32 for the
error), through the kernel the model would run here (Mosaic on TPU, Triton on an NVIDIA GPU, the Pallas
interpreter on CPU) and through `jax.nn.dot_product_attention(implementation='xla')` with the ALiBi bias
matrix. Prints and writes as JSON: the largest relative error of the output and of dq, dk, dv against the
float32 XLA result, the fastest of `--repeats` timed runs of each, and XLA's temporary bytes for each compiled
program (the score matrix shows there).

    .venv/bin/python benchmarks/attention_kernels.py [--seq-lens 512,2048] [--batch 1] [--heads 8]
        [--head-dim 64] [--repeats 5] [--out bench_out/attention_kernels.json]

On CPU the kernel runs interpreted, so its time says nothing; keep the lengths small there.
"""

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax.fileio import write_json_atomic
from celerity_jax.model import positions, transformer


def attention_fns(heads: int, head_dim: int, seq_len: int):
    scale, slopes = 1.0 / head_dim, positions.alibi_slopes(heads)

    def flash(q, k, v):
        return transformer.platform_flash_attention(q, k, v, scale=scale, alibi_slopes_H=slopes)

    def xla(q, k, v):  # the bias is built inside the jitted program: captured, it would be an H×L×L constant
        bias = positions.alibi_bias(heads, seq_len).astype(q.dtype)
        return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True, scale=scale,
                                            implementation="xla")
    return {"flash": flash, "xla": xla}


def value_and_grads(attend):
    def loss(q, k, v, weights):
        out = attend(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * weights), out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def measure(seq_len: int, args) -> dict:
    shape = (args.batch, seq_len, args.heads, args.head_dim)
    keys = jax.random.split(jax.random.key(seq_len), 4)
    q, k, v = (jax.random.normal(key, shape) for key in keys[:3])
    weights = jax.random.normal(keys[3], shape)
    fns = attention_fns(args.heads, args.head_dim, seq_len)
    (_, want_out), want_grads = value_and_grads(fns["xla"])(q, k, v, weights)
    row = {"seq_len": seq_len}
    for name, attend in fns.items():
        step = value_and_grads(attend)
        for dtype in ("float32", "bfloat16"):
            inputs = [x.astype(dtype) for x in (q, k, v)] + [weights]
            compiled = step.lower(*inputs).compile()
            (_, out), grads = compiled(*inputs)
            row[f"{name}_{dtype}_error_out"] = relative_error(out, want_out)
            row[f"{name}_{dtype}_error_grads"] = max(relative_error(g, w) for g, w in zip(grads, want_grads))
            if dtype == "bfloat16":
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    jax.block_until_ready(compiled(*inputs))
                    times.append(time.perf_counter() - start)
                row[f"{name}_ms"] = 1e3 * min(times)
                row[f"{name}_temp_bytes"] = compiled.memory_analysis().temp_size_in_bytes
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default=None, help="comma-separated (default 256,512 on CPU, 2048,8192 else)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench_out/attention_kernels.json")
    args = parser.parse_args(argv)
    backend = jax.default_backend()
    seq_lens = args.seq_lens or ("256,512" if backend == "cpu" else "2048,8192")
    device = jax.devices()[0].device_kind
    print(f"{backend} ({device}), jax {jax.__version__}; batch {args.batch}, {args.heads} heads × {args.head_dim}, "
          "ALiBi, forward + backward; errors against float32 XLA attention; times in bfloat16")
    rows = []
    for seq_len in (int(s) for s in seq_lens.split(",")):
        row = measure(seq_len, args)
        rows.append(row)
        print(f"L {seq_len:6d}  flash: err f32 {row['flash_float32_error_out']:.1e}/{row['flash_float32_error_grads']:.1e}"
              f" bf16 {row['flash_bfloat16_error_out']:.1e}/{row['flash_bfloat16_error_grads']:.1e}, "
              f"{row['flash_ms']:.2f} ms, temp {row['flash_temp_bytes'] / 2**20:.1f} MiB | xla: "
              f"bf16 {row['xla_bfloat16_error_out']:.1e}/{row['xla_bfloat16_error_grads']:.1e}, "
              f"{row['xla_ms']:.2f} ms, temp {row['xla_temp_bytes'] / 2**20:.1f} MiB", flush=True)
    write_json_atomic(args.out, {"backend": backend, "device": device, "host": platform.node(),
                                 "jax": jax.__version__, "batch": args.batch, "heads": args.heads,
                                 "head_dim": args.head_dim, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
