#!/usr/bin/env bash
# The end-to-end pass of benchmarks/accelerator_check.sh: every user-facing step once, on our own BPE data.
#   1. a byte-level BPE tokenizer (`celerity_jax.data.tokenizer.train_bpe`, 2048 tokens) trained on the
#      standard library's training split (no download), then `celerity prepare-data --input stdlib` to
#      ArrayRecord shards with it: checks the tokenizer has the vocabulary asked for and the manifest lists
#      train and validation shards made with it;
#   2. `celerity train` on those shards (experiments/tiny/base.gin + benchmarks/end_to_end.gin: ~19M parameters,
#      6 x 384, 32 x 512 tokens a step, 212 steps) twice: uninterrupted in one workdir; in another, killed with
#      SIGKILL once its first checkpoint is committed, and resumed with the same command. Checks the kill came
#      mid-run, the resume started from a checkpoint, and both curve.csv hold the same losses bit for bit;
#   3. `celerity eval --tasks stdlib_next_line` and `celerity sample --temperature 0 --json` on the trained run:
#      checks a score came back and the samples hold text;
#   4. the uninterrupted run's peak device memory (`jax.devices()[0].memory_stats()`, read in its process after
#      training; CPUs report none) next to `celerity compile --topology T`'s plan for the same config.
# `--dry-run` does all of it on the CPU at a tiny shape (2 x 48, 8 x 128 tokens, 28 steps; about a minute on
# two cores) and compiles no plan unless --topology names one (v5e-1 compiles the TPU plan on the CPU, ~30 s).
# Results: $OUT/end_to_end.json (one file: a device machine returns few) and a printed summary. Shards and runs
# go to a temporary folder, removed on success and kept, named, on failure ($E2E_WORK: a new or empty folder
# to use instead, always kept). Exit status 0 when every check passed, 1 naming each failed check in one line,
# 2 for a bad argument.
#   benchmarks/end_to_end.sh [--dry-run] [--topology h100-1] [--out DIR] [--deterministic]
# $PYTHON: the interpreter (default python3). --deterministic (E2E_DETERMINISTIC=1) adds XLA's
# --xla_gpu_deterministic_ops=true, for when a GPU's runs differ from process to process before any resume.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0 TOPOLOGY="" OUT=${OUT:-bench_out/accelerator_check} DETERMINISTIC=${E2E_DETERMINISTIC:-0}
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --topology) TOPOLOGY=${2:?--topology needs a slice name, e.g. h100-1}; shift ;;
        --out) OUT=${2:?--out needs a folder}; shift ;;
        --deterministic) DETERMINISTIC=1 ;;
        *) echo "end_to_end.sh: unknown argument '$1'; use --dry-run, --topology T, --out DIR, --deterministic" >&2
           exit 2 ;;
    esac
    shift
done
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}; fi
if [ "$DETERMINISTIC" = 1 ]; then export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_deterministic_ops=true"; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${E2E_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/celerity_e2e.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
if [ -n "$(ls -A "$WORK")" ]; then
    echo "end_to_end.sh: E2E_WORK=$WORK is not empty; name a new or empty folder" >&2
    exit 2
fi
: >"$WORK/failures.txt"
: >"$WORK/seconds.txt"

VOCAB=2048
SHARD_TOKENS=1000000  # several train shards, not one
GIN=(--gin-file experiments/tiny/base.gin --gin-file benchmarks/end_to_end.gin
     --gin-param "ModelConfig.vocab_size = $VOCAB" --gin-param "DataConfig.paths = ('$WORK/shards',)"
     --gin-param "DataConfig.tokenizer = '$WORK/tokenizer.json'")
if [ "$DRY" = 1 ]; then
    MODE=dry-run CHECKPOINT=10
    GIN+=(--gin-param "ModelConfig.d_model = 48" --gin-param "ModelConfig.n_heads = 3"
          --gin-param "ModelConfig.head_dim = 16" --gin-param "ModelConfig.n_layers = 2"
          --gin-param "ModelConfig.max_seq_len = 128" --gin-param "RecipeConfig.seq_len = 128"
          --gin-param "RecipeConfig.batch_seqs = 8" --gin-param "RecipeConfig.tpp = 0.1"
          --gin-param "TrainConfig.log_every = 5" --gin-param "TrainConfig.eval_every = 100"
          --gin-param "TrainConfig.eval_batches = 2" --gin-param "TrainConfig.checkpoint_every = $CHECKPOINT")
    EVAL_LIMIT=(--limit 16) NEW_TOKENS=16
else
    MODE=accelerator CHECKPOINT=100  # end_to_end.gin's checkpoint_every
    EVAL_LIMIT=() NEW_TOKENS=64
fi

fail() {  # a failed check: one line, recorded; the pass goes on where later steps can still run
    echo "end_to_end: FAILED: $*" >&2
    echo "$*" >>"$WORK/failures.txt"
}
die() {  # a failed step that later steps need: stop here (the EXIT trap still writes the JSON)
    fail "$@"
    exit 1
}
seconds() {  # seconds NAME START: time since START ($EPOCHREALTIME) into seconds.txt
    awk -v n="$1" -v a="$2" -v b="$EPOCHREALTIME" 'BEGIN { printf "%s %.2f\n", n, b - a }' >>"$WORK/seconds.txt"
}
last_line() { tail -n 1 "$1" 2>/dev/null | cut -c1-300; }

finish() {  # on any exit: gather every result there is into $OUT/end_to_end.json, print the summary
    local rc=$?
    trap - EXIT
    local p
    for p in ${pid:-} ${compile_pid:-}; do kill -KILL "$p" 2>/dev/null || true; done  # ours, still running
    if [ "$rc" -ne 0 ] && [ ! -s "$WORK/failures.txt" ]; then
        echo "stopped (exit $rc) before its checks ended" >>"$WORK/failures.txt"
    fi
    "$PY" - "$WORK" "$OUT/end_to_end.json" "$MODE" "$TOPOLOGY" <<'EOF' \
        || echo "end_to_end: FAILED: could not write $OUT/end_to_end.json" >&2
import json, os, sys
work, path, mode, topology = sys.argv[1:]
def size(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
def load(name):
    p = os.path.join(work, name)
    return json.load(open(p)) if os.path.exists(p) else None
failures = [l for l in open(os.path.join(work, "failures.txt")).read().splitlines() if l]
seconds = dict((n, float(s)) for n, s in (l.split() for l in open(os.path.join(work, "seconds.txt"))))
measured, compiled = load("memory_measured.json"), load("compile.json")
if compiled is not None:
    compiled = {k: compiled.get(k) for k in ("topology", "bytes_per_chip", "hbm_bytes_per_chip", "fits",
                                            "headroom", "compute_dtype", "attention_impl", "compile_seconds",
                                            "error")}
elif topology:
    compiled = {"topology": topology, "bytes_per_chip": None,
                "reason": "celerity compile wrote no report (see failures)"}
else:
    compiled = {"bytes_per_chip": None, "reason": "no --topology given" + (
        ": a dry run on the CPU has no GPU or TPU to plan for (--topology v5e-1 compiles the TPU plan here)"
        if mode == "dry-run" else "")}
memory = {"measured": measured, "planned": compiled}
if measured and measured.get("peak_bytes_in_use") and compiled.get("bytes_per_chip"):
    memory["measured_over_planned"] = measured["peak_bytes_in_use"] / compiled["bytes_per_chip"]
result = {"mode": mode, "ok": not failures, "failures": failures, "work_dir": work if failures else None,
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "device": load("device.json"), "shape": load("shape.json"),
          "bpe": load("bpe.json"), "prepare_data": load("prepare.json"), "train": load("train.json"),
          "eval": load("eval_result.json"), "sample": load("sample_result.json"), "memory": memory,
          "seconds": seconds}
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump(result, f, indent=1)
s, b, p, t = result["shape"], result["bpe"], result["prepare_data"], result["train"]
e, m = result["eval"], result["sample"]
print(f"== end-to-end pass ({mode}) on {(result['device'] or {}).get('device_kind', '?')}: {path}")
if b:
    print(f"BPE: {b['vocab_size']} tokens from {b['trained_on_files']} stdlib files in {b['seconds']:.1f} s")
if p:
    print("shards: " + ", ".join(f"{n} {v['shards']} ({v['tokens']:,} tokens)" for n, v in p["splits"].items()))
if s:
    print(f"model: {s['n_params']:,} parameters, {s['n_layers']} x {s['d_model']}, {s['steps']} steps of "
          f"{s['batch_seqs']} x {s['seq_len']} tokens")
if t:
    same = "equals" if t["resumed_equals_uninterrupted"] else f"DIFFERS from step {t['first_differing_step']} in"
    print(f"train: killed (SIGKILL) after the checkpoint at step {t['killed_after_checkpoint']}, resumed from step "
          f"{t['resumed_from_step']}; its curve ({t['rows']} rows) {same} the uninterrupted run's; final loss "
          f"{t['final_loss']:.4f}")
if e:
    print(f"eval {e['task']}: {e['metric']} {100 * e['value']:.1f}% ± {100 * e['stderr']:.1f} on {e['docs']} docs")
if m:
    for x in m["samples"]:
        print(f"sample (greedy): {x['prompt']!r} -> {x['completion'][:60]!r}")
peak = (measured or {}).get("peak_bytes_in_use")
print("memory: measured " + (f"{size(peak)} peak" if peak else (measured or {}).get("reason", "not reached"))
      + "; planned " + (f"{size(compiled['bytes_per_chip'])} per chip ({compiled['topology']})"
                        if compiled.get("bytes_per_chip") else compiled["reason"]))
print("seconds: " + ", ".join(f"{n} {v:.1f}" for n, v in seconds.items()))
for line in failures:
    print(f"FAILED: {line}")
EOF
    if [ -s "$WORK/failures.txt" ]; then
        echo "end_to_end: $(wc -l <"$WORK/failures.txt") check(s) failed; work files kept in $WORK" >&2
        exit 1
    fi
    [ -n "${E2E_WORK:-}" ] || rm -rf "$WORK"
    exit 0
}
trap finish EXIT
trap 'exit 143' TERM INT  # so that the EXIT trap runs

"$PY" - "$WORK/device.json" <<'EOF' || die "JAX does not start: see above"
import json, sys
import jax
d = jax.devices()[0]
json.dump({"platform": d.platform, "device_kind": d.device_kind, "devices": jax.device_count(),
           "jax": jax.__version__}, open(sys.argv[1], "w"))
EOF

# 1. BPE on the stdlib's training split (the files prepare-data's default hash split keeps out of validation,
#    so stdlib_next_line's held-out files stay unseen), then the shards.
start=$EPOCHREALTIME
"$PY" - "$WORK/tokenizer.json" "$VOCAB" "$WORK/bpe.json" <<'EOF' || die "training the BPE tokenizer failed (see above)"
import json, sys, time
from celerity_jax.data import corpus
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import load_tokenizer, train_bpe
path, vocab, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
start = time.time()
files = [p for k, p in corpus.stdlib_files() if not corpus.is_validation(k, DataConfig().val_fraction)]
texts = []
for p in files:
    with open(p, encoding="utf-8", errors="replace") as f:
        texts.append(f.read())
train_bpe(texts, vocab, path)
tok = load_tokenizer(path)
if tok.vocab_size != vocab:
    sys.exit(f"end_to_end: the BPE has {tok.vocab_size} tokens, not the {vocab} asked for")
json.dump({"vocab_size": tok.vocab_size, "separator_id": tok.separator_id, "sha256": tok.sha256,
           "trained_on_files": len(files), "trained_on_chars": sum(map(len, texts)),
           "seconds": time.time() - start}, open(out, "w"))
EOF
seconds bpe "$start"

start=$EPOCHREALTIME
"$PY" -m celerity_jax.cli prepare-data --input stdlib --tokenizer "$WORK/tokenizer.json" --out "$WORK/shards" \
    --shard-tokens "$SHARD_TOKENS" >"$WORK/prepare.log" 2>&1 \
    || die "celerity prepare-data failed: $(last_line "$WORK/prepare.log")"
seconds prepare_data "$start"
"$PY" - "$WORK/shards" "$WORK/bpe.json" "$WORK/prepare.json" <<'EOF' \
    || die "the shards are not what was asked for (see above)"
import json, os, sys
folder, bpe, out = sys.argv[1:]
m, bpe = json.load(open(os.path.join(folder, "manifest.json"))), json.load(open(bpe))
if m["tokenizer"]["sha256"] != bpe["sha256"] or m["tokenizer"]["vocab_size"] != bpe["vocab_size"]:
    sys.exit(f"end_to_end: the manifest's tokenizer {m['tokenizer']} is not the BPE just trained")
splits = {s: {"shards": len(v["shards"]), "tokens": v["tokens"]} for s, v in m["splits"].items()}
if set(splits) != {"train", "val"} or not all(v["shards"] and v["tokens"] for v in splits.values()):
    sys.exit(f"end_to_end: prepare-data did not write train and val shards: {splits}")
files = sorted(f for f in os.listdir(folder) if f.endswith(".arrayrecord"))
if len(files) != sum(v["shards"] for v in splits.values()):
    sys.exit(f"end_to_end: the manifest lists {splits} shards but the folder holds {files}")
json.dump({"vocab_size": m["tokenizer"]["vocab_size"], "splits": splits, "files": files,
           "bytes": sum(os.path.getsize(os.path.join(folder, f)) for f in files), "summary": m["summary"]},
          open(out, "w"))
EOF

# 4 (started early: it runs on the CPU, beside the training). `celerity compile`'s plan for the same config.
compile_pid=""
if [ -n "$TOPOLOGY" ]; then
    "$PY" -m celerity_jax.cli compile "${GIN[@]}" --topology "$TOPOLOGY" --cache-dir "" --json "$WORK/compile.json" \
        >"$WORK/compile.log" 2>&1 &
    compile_pid=$!
fi

# 2. Train uninterrupted, in a Python process that reads the device's memory statistics once `celerity train`
#    returns (the same `celerity_jax.cli.main` as the command); then the killed and resumed run.
TRAIN=(train "${GIN[@]}")
start=$EPOCHREALTIME
"$PY" - "$WORK/memory_measured.json" "${TRAIN[@]}" --workdir "$WORK/uninterrupted" \
    >"$WORK/uninterrupted.log" 2>&1 <<'EOF' \
    || die "the uninterrupted run failed: $(last_line "$WORK/uninterrupted.log")"
import json, sys
from celerity_jax.cli import main
rc = main(sys.argv[2:])
import jax
d = jax.devices()[0]
stats = d.memory_stats()
if stats is None:
    measured = {"platform": d.platform, "peak_bytes_in_use": None,
                "reason": f"not measured on {d.platform.upper()}: memory_stats() is None there"}
else:
    measured = {"platform": d.platform, "device_kind": d.device_kind,
                "peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
                "what": "the allocator's peak over the whole uninterrupted run (train and eval steps)"}
json.dump(measured, open(sys.argv[1], "w"))
sys.exit(rc)
EOF
seconds train_uninterrupted "$start"

# The plan must run past the checkpoint the second run is killed after.
"$PY" - "$WORK/uninterrupted" "$CHECKPOINT" "$WORK/shape.json" <<'EOF' \
    || die "the run cannot be killed mid-run (see above)"
import json, os, sys
run, checkpoint, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
plan, identity = (json.load(open(os.path.join(run, name))) for name in ("plan.json", "run.json"))
model, recipe = identity["model"], identity["recipe"]
if plan["steps"] <= checkpoint:
    sys.exit(f"end_to_end: the plan has {plan['steps']} steps, so its checkpoint at {checkpoint} is not mid-run")
json.dump({"n_params": plan["n_params"], "steps": plan["steps"], "batch_tokens": plan["batch_tokens"],
           "vocab_size": model["vocab_size"], "d_model": model["d_model"], "n_layers": model["n_layers"],
           "n_heads": model["n_heads"], "seq_len": recipe["seq_len"], "batch_seqs": recipe["batch_seqs"]},
          open(out, "w"))
EOF

start=$EPOCHREALTIME
"$PY" -m celerity_jax.cli "${TRAIN[@]}" --workdir "$WORK/resumed" >"$WORK/killed.log" 2>&1 &
pid=$!
committed="$WORK/resumed/checkpoints/$CHECKPOINT/commit_success.txt"
deadline=$((SECONDS + 900))
while [ ! -e "$committed" ]; do
    if ! kill -0 "$pid" 2>/dev/null || [ "$SECONDS" -gt "$deadline" ]; then
        kill -KILL "$pid" 2>/dev/null || true
        { wait "$pid"; } 2>/dev/null || true
        pid=""
        die "the run to be killed never committed its checkpoint at step $CHECKPOINT: $(last_line "$WORK/killed.log")"
    fi
    sleep 0.05
done
kill -KILL "$pid"
rc=0
{ wait "$pid"; } 2>/dev/null || rc=$?  # (bash's "Killed" job notice is expected here)
pid=""
[ "$rc" -eq 137 ] || die "the run to be killed mid-run ended by itself first (exit $rc); its plan is too short to kill"
seconds train_killed "$start"
start=$EPOCHREALTIME
"$PY" -m celerity_jax.cli "${TRAIN[@]}" --workdir "$WORK/resumed" >"$WORK/resumed.log" 2>&1 \
    || die "the resumed run failed: $(last_line "$WORK/resumed.log")"
seconds train_resumed "$start"

# The resumed curve.csv against the uninterrupted one, loss strings compared exactly (repr of the float32 loss).
# Rows up to the restored step were written by the killed process: a difference there is the device's
# nondeterminism, not the resume.
verdict=$("$PY" - "$WORK" "$CHECKPOINT" <<'EOF'
import csv, json, os, re, sys
work, checkpoint = sys.argv[1], int(sys.argv[2])
n_steps = json.load(open(os.path.join(work, "shape.json")))["steps"]
def curve(run):
    with open(os.path.join(work, run, "curve.csv")) as f:
        return {int(r["step"]): r["loss"] for r in csv.DictReader(f)}
full, resumed = curve("uninterrupted"), curve("resumed")
m = re.search(r"resumed from the checkpoint at step (\d+)", open(os.path.join(work, "resumed.log")).read())
resumed_at = int(m.group(1)) if m else None
steps = sorted(full)
differing = [s for s in sorted(set(full) | set(resumed)) if resumed.get(s) != full.get(s)]
diffs = [abs(float(resumed[s]) - float(full[s])) for s in differing if s in resumed and s in full]
discarded_path = os.path.join(work, "resumed", "curve.csv.discarded")  # what the killed process wrote past it
discarded = 0
if os.path.exists(discarded_path):
    with open(discarded_path) as f:
        discarded = sum(1 for row in csv.reader(f) if row and row[0].isdigit())
with open(os.path.join(work, "uninterrupted", "eval.csv")) as f:
    final_eval = float(list(csv.DictReader(f))[-1]["loss"])
result = {"killed_after_checkpoint": checkpoint, "kill": "SIGKILL", "resumed_from_step": resumed_at,
          "rows": len(resumed), "uninterrupted_rows": len(full),
          "resumed_equals_uninterrupted": not differing and steps == list(range(1, len(steps) + 1)),
          "first_differing_step": differing[0] if differing else None, "differing_rows": len(differing),
          "max_abs_loss_difference": max(diffs, default=0.0),
          "rows_before_the_resume_equal": resumed_at is not None and all(s > resumed_at for s in differing),
          "rows_discarded_on_resume": discarded,
          "first_loss": float(full[steps[0]]), "final_loss": float(full[steps[-1]]), "final_eval_loss": final_eval}
json.dump(result, open(os.path.join(work, "train.json"), "w"), indent=1)
if resumed_at is None or not checkpoint <= resumed_at < n_steps:
    print(f"the killed run did not resume mid-run from a checkpoint at or past step {checkpoint} (resumed_from_step "
          f"{resumed_at} of {n_steps})")
elif not result["resumed_equals_uninterrupted"]:
    why = ("only after the resume" if result["rows_before_the_resume_equal"] else "before the resume too: the "
           "device's steps differ from process to process; try --deterministic")
    print(f"the resumed curve differs from the uninterrupted one from step {result['first_differing_step']} "
          f"({len(differing)} rows, max |d loss| {result['max_abs_loss_difference']:.3g}; {why})")
EOF
) || die "the curves could not be compared (see above)"
[ -z "$verdict" ] || fail "$verdict"

# 3. The built-in downstream task and greedy samples on the trained (killed and resumed) run.
start=$EPOCHREALTIME
if "$PY" -m celerity_jax.cli eval --workdir "$WORK/resumed" --tasks stdlib_next_line "${EVAL_LIMIT[@]}" \
        --json "$WORK/eval.json" >"$WORK/eval.log" 2>&1; then
    "$PY" - "$WORK/eval.json" "$WORK/eval_result.json" <<'EOF' || fail "celerity eval gave no stdlib_next_line score"
import json, sys
content = json.load(open(sys.argv[1]))
score = content["tasks"]["stdlib_next_line"]
if not (0 <= score["value"] <= 1 and score["docs"] > 0):
    sys.exit(f"end_to_end: stdlib_next_line scored {score}")
json.dump({"task": "stdlib_next_line", "step": content["step"], **score}, open(sys.argv[2], "w"))
EOF
else
    fail "celerity eval failed: $(last_line "$WORK/eval.log")"
fi
seconds eval "$start"
start=$EPOCHREALTIME
if "$PY" -m celerity_jax.cli sample --workdir "$WORK/resumed" --prompt "def " --prompt "import " \
        --prompt "class Parser:" --temperature 0 --max-new-tokens "$NEW_TOKENS" --json \
        >"$WORK/sample.json" 2>"$WORK/sample.log"; then
    "$PY" - "$WORK/sample.json" "$WORK/sample_result.json" <<'EOF' || fail "celerity sample produced no text"
import json, sys
content = json.load(open(sys.argv[1]))
samples = content["samples"]
if not samples or not all(s["new_tokens"] > 0 for s in samples) or not any(s["completion"].strip() for s in samples):
    sys.exit(f"end_to_end: celerity sample produced no text: {samples}")
json.dump({"step": content["step"], "temperature": content["temperature"], "samples": samples}, open(sys.argv[2], "w"))
EOF
else
    fail "celerity sample failed: $(last_line "$WORK/sample.log")"
fi
seconds sample "$start"

if [ -n "$compile_pid" ]; then
    start=$EPOCHREALTIME
    rc=0
    wait "$compile_pid" || rc=$?
    compile_pid=""
    seconds compile_wait "$start"
    case "$rc" in
        0) ;;
        1) fail "celerity compile says the config does not fit $TOPOLOGY: $(last_line "$WORK/compile.log")" ;;
        *) fail "celerity compile failed (exit $rc): $(last_line "$WORK/compile.log")" ;;
    esac
fi
