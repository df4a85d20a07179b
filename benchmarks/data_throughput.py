"""Tokens per second of data preparation and of the training data path, next to what training needs.

Three parts, all on the built-in stdlib corpus (nothing is downloaded):
  prepare    `celerity prepare-data`, timed end to end as a command (start-up included), with a BPE
             tokenizer trained here (vocab --bpe-vocab): .jsonl.zst and .parquet inputs (the stdlib files as
             records, --copies times over, in --files files each), one worker against --workers workers. One
             worker tokenizes in the command's process, where the tokenizer library runs its own threads;
             "1 thread" sets TOKENIZERS_PARALLELISM=false to turn them off.
  pipeline   per tokenizer (byte, BPE): loading the in-memory corpus, steady-state batches from memory and
             from ArrayRecord shards at L = --seq-len, B = --batch-seqs, next to the jitted train step of
             the tiny presets at the same shape.
  need       the ArrayRecord iterator at the Celerity-300M v5p-8 plan's shape (L and batch read from
             experiments/celerity/tpu_plans.json) with 0, 1 and 2 grain worker processes, against ten times
             the plan's estimated tokens/s (the train step's rate from `celerity compile`; v5p-8 is one host).

  .venv/bin/python benchmarks/data_throughput.py [--parts prepare,pipeline,need] [--out bench_out/data_throughput.json]
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from celerity_jax.data import corpus, pipeline, prepare
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import train_bpe

PLANS = os.path.join(os.path.dirname(__file__), "..", "experiments", "celerity", "tpu_plans.json")


def _stdlib_texts() -> list[str]:
    return [open(path, encoding="utf-8").read() for _, path in corpus.stdlib_files()]


def _write_inputs(texts: list[str], copies: int, n_files: int, folder: str) -> dict[str, str]:
    """The documents, `copies` times over, as `n_files` .jsonl.zst files and as many .parquet files (row groups of
    500 rows), as corpora are shipped; returns the folder of each format."""
    records = [{"text": t, "id": f"{c}/{i}"} for c in range(copies) for i, t in enumerate(texts)]
    folders = {kind: os.path.join(folder, kind) for kind in ("jsonl.zst", "parquet")}
    for kind, path in folders.items():
        os.makedirs(path)
    for k in range(n_files):
        part = records[k::n_files]
        with open(os.path.join(folders["jsonl.zst"], f"part-{k:03d}.jsonl.zst"), "wb") as f:
            f.write(zstandard.ZstdCompressor().compress("".join(json.dumps(r) + "\n" for r in part).encode()))
        pq.write_table(pa.table({"text": [r["text"] for r in part], "id": [r["id"] for r in part]}),
                       os.path.join(folders["parquet"], f"part-{k:03d}.parquet"), row_group_size=500)
    return folders


def _time_prepare(path: str, tokenizer: str, workers: int, out: str, one_thread: bool) -> dict:
    env = dict(os.environ, **({"TOKENIZERS_PARALLELISM": "false"} if one_thread else {}))
    command = [sys.executable, "-m", "celerity_jax.cli", "prepare-data", "--input", path, "--tokenizer", tokenizer,
               "--workers", str(workers), "--out", out]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    seconds = time.perf_counter() - start
    with open(os.path.join(out, "manifest.json")) as f:
        tokens = sum(s["tokens"] for s in json.load(f)["splits"].values())
    return {"seconds": round(seconds, 2), "tokens": tokens, "tokens_per_s": round(tokens / seconds)}


def measure_prepare(args, tmp: str, texts: list[str], tokenizer: str) -> dict:
    inputs = _write_inputs(texts, args.copies, args.files, tmp)
    runs = [(kind, workers, one_thread) for kind in inputs
            for workers, one_thread in ((1, False), (1, True), (args.workers, False))]
    result = {"files": args.files, "input_bytes": {k: sum(os.path.getsize(os.path.join(p, n)) for n in os.listdir(p))
                                                   for k, p in inputs.items()}, "runs": []}
    outputs = {}
    for i, (kind, workers, one_thread) in enumerate(runs):
        out = os.path.join(tmp, f"prepared-{i}")
        run = {"input": kind, "workers": workers, "one_thread": one_thread,
               **_time_prepare(inputs[kind], tokenizer, workers, out, one_thread)}
        result["runs"].append(run)
        outputs.setdefault(kind, []).append(out)
        print(f"prepare {kind:9s} {workers} worker(s){' 1 thread' if one_thread else '':9s}: "
              f"{run['tokens_per_s'] / 1e6:.2f}M tokens/s ({run['tokens']:,} tokens, {run['seconds']} s)")
    for kind, folders in outputs.items():  # the output must not depend on the worker count
        files = [{n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))} for d in folders]
        assert all(f == files[0] for f in files), f"{kind}: outputs differ between worker counts"
    rate = {(r["input"], r["workers"], r["one_thread"]): r["tokens_per_s"] for r in result["runs"]}
    result["speedup"] = {}
    for kind in inputs:
        many = rate[kind, args.workers, False]
        result["speedup"][kind] = {"over_one_worker": round(many / rate[kind, 1, False], 2),
                                   "over_one_worker_one_thread": round(many / rate[kind, 1, True], 2)}
        print(f"prepare {kind}: {args.workers} workers = {result['speedup'][kind]['over_one_worker']}x one worker, "
              f"{result['speedup'][kind]['over_one_worker_one_thread']}x one worker with one thread")
    return result


def _batches_per_s(it, n: int) -> float:
    next(it)
    start = time.perf_counter()
    for _ in range(n):
        next(it)
    return n / (time.perf_counter() - start)


def measure_pipeline(cfg: DataConfig, seq_len: int, batch_seqs: int, n_batches: int, workdir: str) -> dict:
    start = time.perf_counter()
    loaded = corpus.load_corpus(cfg)
    load_s = time.perf_counter() - start
    n_tokens = loaded.train.size + loaded.val.size
    batch_tokens = seq_len * batch_seqs
    iterator = _batches_per_s(pipeline.make_train_iterator(cfg, seq_len, batch_seqs, seed=0), n_batches)
    prepare.prepare(cfg, workdir, stream=open(os.devnull, "w"))
    shard_cfg = DataConfig(source="arrayrecord", paths=(workdir,), tokenizer=cfg.tokenizer)
    shards = _batches_per_s(pipeline.make_train_iterator(shard_cfg, seq_len, batch_seqs, seed=0), n_batches // 4)
    return {"corpus_tokens": int(n_tokens), "vocab_size": loaded.stats["vocab_size"],
            "load_s": round(load_s, 3), "load_tokens_per_s": round(n_tokens / load_s),
            "iterator_tokens_per_s": round(iterator * batch_tokens), "shards_tokens_per_s": round(shards * batch_tokens)}


def measure_train_step(preset: str, vocab_size: int, seq_len: int, batch_seqs: int, n_steps: int) -> float:
    import jax

    from celerity_jax import optim, recipe
    from celerity_jax.collapse.config import MonitorConfig
    from celerity_jax.model import completep, presets, transformer
    from celerity_jax.train import step as step_lib

    model_cfg = dataclasses.replace(presets.preset(preset), vocab_size=vocab_size)
    plan = recipe.make_plan(model_cfg, recipe.RecipeConfig(seq_len=seq_len, batch_seqs=batch_seqs))
    rng = jax.random.key(0)
    multipliers = completep.multipliers(model_cfg, transformer.declarations(model_cfg))
    optimizer = optim.build_optimizer(plan, multipliers)
    state = step_lib.init_state(model_cfg, optimizer, MonitorConfig(), rng)
    train_step = step_lib.make_train_step(model_cfg, plan, optimizer, microbatches=1, z_loss=0.0)
    batch = next(pipeline.make_train_iterator(DataConfig(), seq_len, batch_seqs, seed=0))
    batch = {k: jax.numpy.asarray(v) for k, v in batch.items()}
    state, metrics = train_step(state, batch)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(n_steps):
        state, metrics = train_step(state, batch)
    np.asarray(metrics["train/loss"])
    return n_steps * seq_len * batch_seqs / (time.perf_counter() - start)


def measure_pipelines(args, tmp: str, bpe: str) -> dict:
    result = {"seq_len": args.seq_len, "batch_seqs": args.batch_seqs, "tokenizers": {}, "train_step_tokens_per_s": {}}
    for name, cfg in (("byte", DataConfig()), ("bpe", DataConfig(tokenizer=bpe))):
        result["tokenizers"][name] = measure_pipeline(cfg, args.seq_len, args.batch_seqs, args.batches,
                                                      os.path.join(tmp, f"shards-{name}"))
        print(f"{name:5s} pipeline: " + ", ".join(f"{k} {v:,}" for k, v in result["tokenizers"][name].items()))
    for preset in filter(None, args.models.split(",")):
        rate = measure_train_step(preset, result["tokenizers"]["byte"]["vocab_size"], args.seq_len, args.batch_seqs,
                                  args.steps)
        result["train_step_tokens_per_s"][preset] = round(rate)
        print(f"train step {preset}: {rate:,.0f} tokens/s")
    if result["train_step_tokens_per_s"]:
        slowest_data = min(min(p["iterator_tokens_per_s"], p["shards_tokens_per_s"])
                           for p in result["tokenizers"].values())
        result["data_over_fastest_step"] = round(slowest_data / max(result["train_step_tokens_per_s"].values()), 1)
        print(f"slowest pipeline / fastest train step: {result['data_over_fastest_step']}x (target >= 10x)")
    return result


def measure_need(args, tmp: str) -> dict:
    with open(PLANS) as f:
        plan = next(p["best"] for p in json.load(f) if p["size"] == "300m" and p["topology"] == "v5p-8")
    seq_len, batch_seqs = plan["seq_len"], plan["batch_seqs"]
    need = 10 * plan["est_tokens_per_sec"]
    folder = os.path.join(tmp, "shards-need")
    prepare.prepare(DataConfig(), folder, stream=open(os.devnull, "w"))
    result = {"plan": "Celerity-300M on v5p-8 (one host)", "seq_len": seq_len, "batch_seqs": batch_seqs,
              "est_step_tokens_per_s": round(plan["est_tokens_per_sec"]), "needed_tokens_per_s": round(need),
              "iterator_tokens_per_s": {}}
    print(f"need: the 300M v5p-8 step is estimated at {plan['est_tokens_per_sec']:,.0f} tokens/s: the data path "
          f"needs {need:,.0f} tokens/s per host (10x)")
    for workers in (0, 1, 2):
        cfg = DataConfig(source="arrayrecord", paths=(folder,), read_workers=workers)
        it = pipeline.make_train_iterator(cfg, seq_len, batch_seqs, seed=0)
        rate = _batches_per_s(it, args.need_batches) * seq_len * batch_seqs
        it.close()
        result["iterator_tokens_per_s"][workers] = round(rate)
        print(f"need: ArrayRecord iterator, L {seq_len}, B {batch_seqs}, {workers} read workers: {rate:,.0f} tokens/s "
              f"({rate / need:.1f}x the need)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="prepare,pipeline,need")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--copies", type=int, default=6, help="stdlib copies in the prepare inputs")
    parser.add_argument("--files", type=int, default=12, help="files per format in the prepare inputs")
    parser.add_argument("--bpe-vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-seqs", type=int, default=32)
    parser.add_argument("--batches", type=int, default=1000, help="batches timed per in-memory iterator")
    parser.add_argument("--models", default="tiny-d48,tiny-d80", help="presets whose train step is timed ('' skips)")
    parser.add_argument("--steps", type=int, default=50, help="train steps timed per model")
    parser.add_argument("--need-batches", type=int, default=20, help="batches timed at the 300M plan's shape")
    parser.add_argument("--out", default="bench_out/data_throughput.json")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    warnings.filterwarnings("ignore", "the training split", RuntimeWarning)  # the timed loops may wrap around

    result = {"machine": f"{os.cpu_count()} CPU cores", "parts": sorted(parts)}
    with tempfile.TemporaryDirectory() as tmp:
        texts = _stdlib_texts()
        bpe = train_bpe(texts[::10], args.bpe_vocab, os.path.join(tmp, "tokenizer.json"))
        if "prepare" in parts:
            result["prepare"] = measure_prepare(args, tmp, texts, bpe)
        if "pipeline" in parts:
            result["pipeline"] = measure_pipelines(args, tmp, bpe)
        if "need" in parts:
            result["need"] = measure_need(args, tmp)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
