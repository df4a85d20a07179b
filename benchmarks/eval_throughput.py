"""Evaluation throughput: batched scoring against the plain forward, KV-cache sampling against full recompute.

Scoring: a seeded mix like lm-evaluation-harness's multiple choice (N contexts of 20–200 tokens, each with 4
continuations of 1–30 tokens, so 4N requests that share their context) scored by `scoring.Scorer.score`, timed
wall-clock with its host work. Its tokens/s counts the requests' real tokens (context + continuation − 1 each, as
`Scorer.stats.real_tokens` does); `Scorer.stats.real_share` is their share of the tokens fed. Against:
`transformer.apply` jitted on full [B, L] batches of random tokens (no padding) at the Scorer's batch size B and L
the bucketed mean request length, as many calls as make the Scorer's fed tokens. A warm-up pass of each compiles
every shape first (compiles are excluded); then the two alternate, and each counts at its median repeat.

Sampling: B prompts of 28–36 tokens, each continued by 256 greedy tokens. Cached: `sampler.generate` end to end
(prefill, then one `cached_step` per token with its host work); prefill alone: a new cache and one `Decoder.step`
over the padded prompts, as `generate` starts; decode: generate minus prefill. Against: a jitted step that runs
`transformer.apply` on each row's whole sequence so far, right-padded to a fixed length (prompt + 256, one
compile), takes the logits at the row's last token and appends their argmax, 256 times (one timed run after a
compiling call). The model's context is raised to hold prompt + 256 (ALiBi: the parameters do not change), and
the tokenizer has no end-of-text token, so every row makes all 256 tokens; the two ways must give the same ones.

Goals: scoring ≥ 70% of the forward's tokens/s with ≥ 80% real tokens; cached ≥ 10× the recompute.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/eval_throughput.py [--size tiny-d128] [--d-model D]
        [--layers N] [--contexts 75] [--batch 16] [--prompts 8] [--new-tokens 256] [--repeats 5]
        [--out bench_out/eval_throughput.json]
"""

import argparse
import dataclasses
import functools
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax import hostmem
from celerity_jax.data.tokenizer import ByteTokenizer
from celerity_jax.evaluate import sampler, scoring
from celerity_jax.accelerators import host_cpu_name
from celerity_jax.fileio import write_json_atomic
from celerity_jax.model import presets, sharding, transformer

SCORING_GOAL, REAL_SHARE_GOAL, SPEEDUP_GOAL = 0.70, 0.80, 10.0


class NoEndOfText(ByteTokenizer):
    """Bytes, with no token that ends a generation."""
    separator_id = -1



def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def multiple_choice(n_contexts: int, vocab: int, rng) -> list[tuple[list[int], list[int]]]:
    requests = []
    for _ in range(n_contexts):
        context = rng.integers(0, vocab, rng.integers(20, 201)).tolist()
        requests += [(context, rng.integers(0, vocab, rng.integers(1, 31)).tolist()) for _ in range(4)]
    return requests


def bench_scoring(cfg, params, mesh, args, rng) -> dict:
    requests = multiple_choice(args.contexts, cfg.vocab_size - 1, rng)
    scorer = scoring.Scorer(cfg, params, mesh, args.batch)
    scorer.score(requests)  # compiles every bucketed length
    stats = dataclasses.replace(scorer.stats)  # one pass's counts (the scorer's own keep adding up)
    mean_len = stats.real_tokens / len(requests)
    seq_len = sampler.bucket_length(round(mean_len), cfg.max_seq_len)
    tokens_BxL = jnp.asarray(rng.integers(0, cfg.vocab_size, (scorer.batch_size, seq_len)), jnp.int32)
    calls = max(1, round(stats.fed_tokens / tokens_BxL.size))

    def forward():
        for _ in range(calls):
            logits_BxLxV = transformer.apply(cfg, params, tokens_BxL)
        logits_BxLxV.block_until_ready()

    forward()  # compiles
    score_s, forward_s = [], []
    for _ in range(args.repeats):
        score_s.append(timed(lambda: scorer.score(requests)))
        forward_s.append(timed(forward))
    score_tps = stats.real_tokens / statistics.median(score_s)
    forward_tps = calls * tokens_BxL.size / statistics.median(forward_s)
    return {"requests": len(requests), "contexts": args.contexts, "batch": scorer.batch_size,
            "real_tokens": stats.real_tokens, "fed_tokens": stats.fed_tokens, "real_share": stats.real_share,
            "mean_request_tokens": mean_len, "score_s": score_s, "tokens_per_s": score_tps,
            "fed_tokens_per_s": stats.fed_tokens / statistics.median(score_s),
            "forward_shape": [scorer.batch_size, seq_len], "forward_calls": calls, "forward_s": forward_s,
            "forward_tokens_per_s": forward_tps, "ratio": score_tps / forward_tps}


@functools.partial(jax.jit, static_argnums=0)
def recompute_step(cfg, params, tokens_BxL, length_B):
    """The whole forward over every row; the argmax after each row's last token written after it."""
    logits_BxLxV = transformer.apply(cfg, params, tokens_BxL)
    last_BxV = jnp.take_along_axis(logits_BxLxV, (length_B - 1)[:, None, None], axis=1)[:, 0]
    next_B = jnp.argmax(last_BxV, axis=-1).astype(jnp.int32)
    return tokens_BxL.at[jnp.arange(tokens_BxL.shape[0]), length_B].set(next_B), length_B + 1


def bench_sampling(cfg, params, mesh, args, rng) -> dict:
    prompts = [rng.integers(0, 256, rng.integers(28, 37)).tolist() for _ in range(args.prompts)]
    lengths = np.array([len(p) for p in prompts], np.int32)
    total = int(lengths.max()) + args.new_tokens
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, total))
    decoder = sampler.Decoder(cfg, params, mesh)
    tokenizer = NoEndOfText()

    def generate():
        return sampler.generate(decoder, tokenizer, prompts, max_new_tokens=args.new_tokens, batch_size=args.prompts)

    rows = decoder.padded_rows(len(prompts))
    slots = sampler.bucket_length(total, cfg.max_seq_len)
    padded_BxP = np.zeros((rows, sampler.bucket_length(int(lengths.max()), cfg.max_seq_len)), np.int32)
    for b, p in enumerate(prompts):
        padded_BxP[b, :len(p)] = p
    last_B = np.zeros(rows, np.int32)
    last_B[:len(prompts)] = lengths - 1

    def prefill():
        next_B, _, _ = decoder.step(decoder.new_cache(rows, slots), padded_BxP, np.zeros(rows), last_B,
                                    jax.random.key(0), 0.0, 1.0)
        next_B.block_until_ready()

    cached = generate()  # compiles the prefill and the decode step
    generate_s, prefill_s = [], []
    for _ in range(args.repeats):
        generate_s.append(timed(generate))
        prefill_s.append(timed(prefill))

    tokens_BxL = np.zeros((len(prompts), total), np.int32)
    for b, p in enumerate(prompts):
        tokens_BxL[b, :len(p)] = p
    jax.block_until_ready(recompute_step(cfg, params, tokens_BxL, lengths))  # compiles

    def recompute():
        state = (jnp.asarray(tokens_BxL), jnp.asarray(lengths))
        for _ in range(args.new_tokens):
            state = recompute_step(cfg, params, *state)
        return np.asarray(state[0])

    start = time.perf_counter()
    full_BxL = recompute()
    recompute_s = time.perf_counter() - start
    agree = [g.token_ids == full_BxL[b, n:n + args.new_tokens].tolist()
             for b, (g, n) in enumerate(zip(cached, lengths))]
    new_tokens = len(prompts) * args.new_tokens
    gen_s, pre_s = statistics.median(generate_s), statistics.median(prefill_s)
    return {"prompts": len(prompts), "prompt_tokens": int(lengths.sum()), "new_tokens_per_row": args.new_tokens,
            "cache_slots": slots, "recompute_len": total, "generate_s": generate_s, "prefill_s": prefill_s,
            "prefill_tokens_per_s": int(lengths.sum()) / pre_s,
            "decode_tokens_per_s": len(prompts) * (args.new_tokens - 1) / (gen_s - pre_s),
            "cached_new_tokens_per_s": new_tokens / gen_s, "recompute_s": recompute_s,
            "recompute_new_tokens_per_s": new_tokens / recompute_s, "speedup": recompute_s / gen_s,
            "rows_agree": sum(agree), "all_agree": all(agree)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny-d128", choices=[p for p in presets.PRESETS if p.startswith("tiny")])
    parser.add_argument("--d-model", type=int, default=None, help="override the width (heads of the preset's size)")
    parser.add_argument("--layers", type=int, default=None, help="override the depth")
    parser.add_argument("--seq-len", type=int, default=256, help="the model's context (max_seq_len)")
    parser.add_argument("--contexts", type=int, default=75, help="multiple-choice contexts, 4 requests each")
    parser.add_argument("--batch", type=int, default=16, help="Scorer batch size (the harness's default)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts generated in one batch")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_out/eval_throughput.json")
    args = parser.parse_args()
    hostmem.retain_freed_memory()  # as the celerity CLI does, before JAX allocates anything

    base = presets.preset(args.size)
    d_model = args.d_model or base.d_model
    cfg = presets.preset(args.size, d_model=d_model, n_heads=d_model // base.head_dim,
                         n_layers=args.layers or base.n_layers, max_seq_len=args.seq_len, compute_dtype="float32")
    params = transformer.init_params(cfg, jax.random.key(args.seed))
    mesh = sharding.make_mesh((-1, 1, 1))
    rng = np.random.default_rng(args.seed)
    machine = {"machine": platform.machine(), "cpu": host_cpu_name(), "cpu_count": os.cpu_count(),
               "jax": jax.__version__, "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
               "host": platform.node()}
    model = {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "head_dim": cfg.head_dim,
             "vocab_size": cfg.vocab_size, "max_seq_len": cfg.max_seq_len, "dtype": cfg.dtype,
             "attention": cfg.attention_kernel}
    print(f"{machine['machine']} {machine['cpu']}, {machine['cpu_count']} cores, jax {machine['jax']}, "
          f"load average {os.getloadavg()[0]:.1f}; {args.size} d{cfg.d_model}×{cfg.n_layers} "
          f"vocab {cfg.vocab_size} context {cfg.max_seq_len} {cfg.dtype}")

    s = bench_scoring(cfg, params, mesh, args, rng)
    print(f"scoring ({s['requests']} requests, batch {s['batch']}; median of {args.repeats} after a warm-up pass, "
          "compiles excluded)")
    print(f"  {'Scorer.score':<28s} {s['tokens_per_s']:9.0f} real tokens/s ({s['fed_tokens_per_s']:.0f} fed), "
          f"real share {100 * s['real_share']:.1f}%")
    print(f"  {'forward ' + 'x'.join(map(str, s['forward_shape'])) + ' (no padding)':<28s} "
          f"{s['forward_tokens_per_s']:9.0f} tokens/s")
    print(f"  ratio {100 * s['ratio']:.1f}%")

    g = bench_sampling(cfg, params, mesh, args, rng)
    print(f"sampling ({g['prompts']} prompts, {g['prompt_tokens']} prompt tokens, {g['new_tokens_per_row']} greedy "
          f"new tokens each; cache {g['cache_slots']} slots, recompute at length {g['recompute_len']})")
    print(f"  {'prefill (Decoder.step)':<28s} {g['prefill_tokens_per_s']:9.0f} prompt tokens/s")
    print(f"  {'decode (cached)':<28s} {g['decode_tokens_per_s']:9.0f} tokens/s")
    print(f"  {'generate, end to end':<28s} {g['cached_new_tokens_per_s']:9.0f} new tokens/s "
          f"({statistics.median(g['generate_s']):.2f} s)")
    print(f"  {'full recompute per token':<28s} {g['recompute_new_tokens_per_s']:9.0f} new tokens/s "
          f"({g['recompute_s']:.2f} s)")
    print(f"  speedup {g['speedup']:.1f}×; greedy tokens agree: {g['all_agree']} "
          f"({g['rows_agree']}/{g['prompts']} rows)")

    goals = {"scoring": s["ratio"] >= SCORING_GOAL and s["real_share"] >= REAL_SHARE_GOAL,
             "sampling": g["speedup"] >= SPEEDUP_GOAL}
    print(f"goal: scoring ≥ {100 * SCORING_GOAL:.0f}% of the forward with ≥ {100 * REAL_SHARE_GOAL:.0f}% real "
          f"tokens: {'met' if goals['scoring'] else 'missed'}")
    print(f"goal: cached decoding ≥ {SPEEDUP_GOAL:.0f}× the full recompute: "
          f"{'met' if goals['sampling'] else 'missed'}")
    load = os.getloadavg()[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json_atomic(args.out, {"machine": machine, "load_average": load, "args": vars(args), "model": model,
                                 "scoring": s, "sampling": g, "goals_met": goals})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
