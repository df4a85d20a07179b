#!/usr/bin/env bash
# One-shot check on a machine with one NVIDIA H100 or H200 (parts 0-3 under 10 minutes, part 4 a few more):
#   0. `benchmarks/attention_kernels.py` at 2048 and 8192 tokens: the Triton flash kernel (attention_impl 'flash',
#      what 'auto' picks on a GPU) against XLA's attention: errors, time and temporary memory;
#   1. `celerity compile` for that GPU, on the benchmark's 300M shape (celerity-300m, 16 × 2048 tokens, scanned
#      layers, one microbatch, flash attention): the per-GPU bytes XLA plans (and its estimates, where XLA gives them);
#   2. `benchmarks/train_throughput.py --sizes 300m`: the measured step time, MFU and peak GPU memory;
#   3. a side-by-side line of both, and everything as JSON under $OUT (default bench_out/accelerator_check);
#   4. `benchmarks/end_to_end.sh --topology <gpu>-1`: the whole path once at a small but real shape (~19M
#      parameters): a BPE tokenizer and `celerity prepare-data` shards, `celerity train` killed with SIGKILL after
#      a checkpoint and resumed (its curve must equal an uninterrupted run's bit for bit), `celerity eval
#      --tasks stdlib_next_line`, `celerity sample`, and the run's peak GPU memory next to `celerity compile`'s
#      plan; into $OUT/end_to_end.json.
# Modes (flag or environment variable):
#   --dry-run (DRY_RUN=1)             no GPU: skips 0-3 and runs 4 on the CPU at a tiny shape (about a minute);
#   --end-to-end-only (E2E_ONLY=1)    on the GPU, 4 alone (e.g. as a second device call after 0-3);
#   --no-end-to-end (NO_E2E=1)        on the GPU, 0-3 alone (the check as it was).
# Needs jax with CUDA plus this project's dependencies importable by `python3` or $PYTHON (e.g. `pip install -e .
# "jax[cuda12]"`); PYTHONPATH is set to the repository so nothing has to be installed for the project itself.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY_RUN=${DRY_RUN:-0} E2E_ONLY=${E2E_ONLY:-0} NO_E2E=${NO_E2E:-0}
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        --end-to-end-only) E2E_ONLY=1 ;;
        --no-end-to-end) NO_E2E=1 ;;
        *) echo "accelerator_check.sh: unknown argument '$arg'; use --dry-run, --end-to-end-only or --no-end-to-end" >&2
           exit 2 ;;
    esac
done
OUT=${OUT:-bench_out/accelerator_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHON="$PY"

if [ "$DRY_RUN" = 1 ]; then  # 4 alone, on the CPU at the tiny shape: the whole path, checked before a GPU is lent
    exec bash benchmarks/end_to_end.sh --dry-run --out "$OUT"
fi

"$PY" - <<'EOF'
import jax
print("jax", jax.__version__, "devices:", jax.devices())
assert jax.default_backend() == "gpu", "this check needs a GPU"
EOF
GPU=$("$PY" -c "
import jax
from celerity_jax.accelerators import CHIPS
kind = jax.devices()[0].device_kind
print(next((n for n in ('h100', 'h200') if any(kind.startswith(k) for k in CHIPS[n].device_kinds)), ''))")
[ -n "$GPU" ] || { echo "celerity compile describes the H100 and H200 only; this GPU is another"; exit 2; }

if [ "$E2E_ONLY" = 1 ]; then
    exec bash benchmarks/end_to_end.sh --topology "$GPU-1" --out "$OUT"
fi

time "$PY" benchmarks/attention_kernels.py --seq-lens 2048,8192 --heads 10 --head-dim 64 \
    --out "$OUT/attention_kernels.json" || echo "the attention kernel check failed (see above)"

# the benchmark's 300m shape, as gin bindings on top of the Celerity 300M size file
SHAPE=(--gin-file experiments/celerity/300m_20tpp.gin
       --gin-param "RecipeConfig.seq_len = 2048" --gin-param "RecipeConfig.batch_seqs = 16"
       --gin-param "ModelConfig.scan_layers = True"
       --gin-param "TrainConfig.mesh_shape = (1, 1, 1)")
time "$PY" -m celerity_jax.cli compile "${SHAPE[@]}" --topology "$GPU-1" --cache-dir "" --json "$OUT/compile.json" \
    || echo "celerity compile did not finish (see above)"
time "$PY" benchmarks/train_throughput.py --sizes 300m --steps 6 --out "$OUT/train_throughput.json"

"$PY" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
measured = json.load(open(os.path.join(out, "train_throughput.json")))
import jax
from celerity_jax.accelerators import peak_flops_per_device
row = next(r for r in measured["rows"] if r["size"] == "300m")
peak = peak_flops_per_device(jax.devices()[0].device_kind)
line = {"measured_step_seconds": row["step_s"], "measured_tokens_per_sec": row["tokens_per_s"],
        "measured_mfu": row["model_flops_per_s"] / peak, "measured_peak_bytes": row["peak_memory_bytes"],
        "measured_compile_seconds": row["compile_s"]}
path = os.path.join(out, "compile.json")
if os.path.exists(path):
    planned = json.load(open(path))
    line.update({"compiled_bytes_per_chip": planned["bytes_per_chip"], "est_step_seconds": planned["est_step_seconds"],
                 "est_mfu": planned["est_mfu"], "compile_seconds": planned["compile_seconds"]})
print(json.dumps(line, indent=1))
json.dump(line, open(os.path.join(out, "comparison.json"), "w"), indent=1)
EOF

# 4. the end-to-end pass at its GPU shape; its exit status is the check's
if [ "$NO_E2E" != 1 ]; then
    time bash benchmarks/end_to_end.sh --topology "$GPU-1" --out "$OUT"
fi
