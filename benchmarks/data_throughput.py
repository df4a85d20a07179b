"""Tokens per second of the data pipeline (byte and BPE tokenizers) next to the train step's token rate.

For each tokenizer, on the built-in stdlib corpus:
  load      reading, tokenizing and packing the corpus (what the first batch waits for), tokens/s and s
  iterator  steady-state batches from the in-memory stream, tokens/s
  prepare   `celerity prepare-data` writing the corpus as ArrayRecord shards, tokens/s
  shards    steady-state batches read from those shards, tokens/s
The BPE tokenizer.json is trained here, on every 10th stdlib file (nothing is downloaded). The train step
is the trainer's jitted step on the named presets (vocab set to the byte tokenizer's), same batch shape.

  .venv/bin/python benchmarks/data_throughput.py [--seq-len 64] [--batch-seqs 32] [--models tiny-d48,tiny-d80]
"""

import argparse
import dataclasses
import json
import os
import tempfile
import time
import warnings

from celerity_jax.data import arrayrecord, corpus, pipeline
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import train_bpe


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
    start = time.perf_counter()
    arrayrecord.prepare(cfg, workdir)
    prepare_s = time.perf_counter() - start
    shard_cfg = DataConfig(source="arrayrecord", paths=(workdir,))
    shards = _batches_per_s(pipeline.make_train_iterator(shard_cfg, seq_len, batch_seqs, seed=0), n_batches // 4)
    return {"corpus_tokens": int(n_tokens), "vocab_size": loaded.stats["vocab_size"],
            "load_s": round(load_s, 3), "load_tokens_per_s": round(n_tokens / load_s),
            "iterator_tokens_per_s": round(iterator * batch_tokens),
            "prepare_tokens_per_s": round(n_tokens / prepare_s), "shards_tokens_per_s": round(shards * batch_tokens)}


def measure_train_step(preset: str, vocab_size: int, seq_len: int, batch_seqs: int, n_steps: int) -> float:
    import jax
    import numpy as np

    from celerity_jax import optim, recipe
    from celerity_jax.collapse.config import MonitorConfig
    from celerity_jax.model import completep, presets, transformer
    from celerity_jax.train import step as step_lib

    model_cfg = dataclasses.replace(presets.preset(preset), vocab_size=vocab_size)
    plan = recipe.make_plan(model_cfg, recipe.RecipeConfig(seq_len=seq_len, batch_seqs=batch_seqs))
    rng = jax.random.key(0)
    multipliers = completep.multipliers(model_cfg, jax.eval_shape(lambda: transformer.init_params(model_cfg, rng)))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-seqs", type=int, default=32)
    parser.add_argument("--batches", type=int, default=1000, help="batches timed per in-memory iterator")
    parser.add_argument("--bpe-vocab", type=int, default=2048)
    parser.add_argument("--models", default="tiny-d48,tiny-d80", help="presets whose train step is timed ('' skips)")
    parser.add_argument("--steps", type=int, default=50, help="train steps timed per model")
    parser.add_argument("--out", default="bench_out/data_throughput.json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "the training split", RuntimeWarning)  # the timed loops may wrap around

    result = {"seq_len": args.seq_len, "batch_seqs": args.batch_seqs, "pipeline": {}, "train_step_tokens_per_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        files = corpus.stdlib_files()
        bpe = train_bpe((open(p, encoding="utf-8").read() for _, p in files[::10]), args.bpe_vocab,
                        os.path.join(tmp, "tokenizer.json"))
        for name, cfg in (("byte", DataConfig()), ("bpe", DataConfig(tokenizer=bpe))):
            result["pipeline"][name] = measure_pipeline(cfg, args.seq_len, args.batch_seqs, args.batches,
                                                        os.path.join(tmp, f"shards-{name}"))
            print(f"{name:5s} pipeline: " + ", ".join(f"{k} {v:,}" for k, v in result["pipeline"][name].items()))
    for preset in filter(None, args.models.split(",")):
        rate = measure_train_step(preset, result["pipeline"]["byte"]["vocab_size"], args.seq_len, args.batch_seqs,
                                  args.steps)
        result["train_step_tokens_per_s"][preset] = round(rate)
        print(f"train step {preset}: {rate:,.0f} tokens/s")
    if result["train_step_tokens_per_s"]:
        slowest_data = min(min(p["iterator_tokens_per_s"], p["shards_tokens_per_s"])
                           for p in result["pipeline"].values())
        result["data_over_fastest_step"] = round(slowest_data / max(result["train_step_tokens_per_s"].values()), 1)
        print(f"slowest pipeline / fastest train step: {result['data_over_fastest_step']}x (target >= 10x)")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
