"""`celerity sample` (text from a run's checkpoint, with a KV cache) and `celerity eval` (lm-evaluation-harness
tasks on it, scores into the run directory and TensorBoard). The library is `celerity_jax/evaluate/`."""

import argparse
import math
import os

from celerity_jax.cli import options
from celerity_jax.errors import ConfigError


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("sample", help="generate text from a run's checkpoint")
    _add_model_options(p)
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="a prompt; repeatable (an empty prompt starts a new document)")
    p.add_argument("--prompts-file", metavar="F", help="a text file of prompts, one per line")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="0 (the default) is greedy; above 0 samples from softmax(logits / T)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sample from the smallest set of tokens whose probability reaches P (default 1: all)")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    p.add_argument("--stop", nargs="+", action="extend", default=[], metavar="STR",
                   help="stop a prompt's generation at any of these strings (the text is cut before it)")
    p.add_argument("--batch-size", type=int, default=8, metavar="B", help="prompts decoded together (default 8)")
    options.add_json_option(p, "the prompts and their continuations")
    p.set_defaults(func=sample_command)

    p = subparsers.add_parser("eval", help="score a run's checkpoint on lm-evaluation-harness tasks")
    _add_model_options(p)
    p.add_argument("--tasks", required=True, metavar="LIST",
                   help="comma list of tasks (task or task:shots), 'celerity' (the paper's seven tasks and their "
                        "average) or 'stdlib_next_line' (the built-in task, no data needed)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="the tasks' data, DIR/<task>/<split>.jsonl (docs/evaluation.md); not needed for "
                        "the built-in task")
    p.add_argument("--limit", type=int, metavar="N", help="score the first N documents of each task (default: all)")
    p.add_argument("--batch-size", type=int, default=16, metavar="B", help="requests scored together (default 16)")
    options.add_json_option(p, "the scores")
    p.set_defaults(func=eval_command)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="a run directory written by `celerity train`")
    p.add_argument("--step", type=int, metavar="S", help="a saved checkpoint's step (default: the newest)")


def _positive(args, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={value} must be a positive whole number")


def _read_prompts(args) -> list[str]:
    if bool(args.prompt) == bool(args.prompts_file):
        raise ConfigError("give prompts with --prompt TEXT (repeatable) or --prompts-file F, one of the two")
    if args.prompt:
        return list(args.prompt)
    try:
        with open(args.prompts_file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--prompts-file {args.prompts_file} cannot be read ({e}); give a UTF-8 text file with "
                          "one prompt per line") from None
    if not prompts:
        raise ConfigError(f"--prompts-file {args.prompts_file} holds no prompt; write one prompt per line")
    return prompts


def sample_command(args: argparse.Namespace) -> int:
    _positive(args, "max_new_tokens", "batch_size")
    if not (math.isfinite(args.temperature) and args.temperature >= 0) or not 0 < args.top_p <= 1:
        raise ConfigError(f"--temperature={args.temperature} must be a finite number >= 0 and --top-p={args.top_p} "
                          "in (0, 1]")
    if not 0 <= args.seed < 2**63:
        raise ConfigError(f"--seed={args.seed} must be a whole number in [0, 2**63); choose a smaller seed")
    if "" in args.stop:
        raise ConfigError("--stop got an empty string, which would stop every generation before its first token; "
                          "give non-empty stop strings")
    options.check_json(args.json)
    prompts = _read_prompts(args)
    from celerity_jax.evaluate import harness, loader, sampler

    model = loader.load_model(args.workdir, args.step)
    harness.check_can_decode(model.tokenizer)
    ids = []
    for i, text in enumerate(prompts):
        tokens = [int(t) for t in model.tokenizer.encode_batch([text])[0]] or [model.tokenizer.separator_id]
        if len(tokens) >= model.max_len:
            raise ConfigError(f"prompt {i + 1} is {len(tokens)} tokens, and the model reads at most {model.max_len} "
                              "with room for one new token; shorten it")
        ids.append(tokens)
    decoder = sampler.Decoder(model.cfg, model.params, model.mesh)
    generations = sampler.generate(decoder, model.tokenizer, ids, max_new_tokens=args.max_new_tokens,
                                   temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                                   stop=tuple(args.stop), batch_size=args.batch_size)
    samples = [{"prompt": p, "completion": g.text, "new_tokens": len(g.token_ids), "stopped": g.stopped}
               for p, g in zip(prompts, generations)]
    settings = {k: getattr(args, k) for k in ("max_new_tokens", "temperature", "top_p", "seed", "stop")}
    if options.emit_json(args.json, {"workdir": args.workdir, "step": model.step, **settings, "samples": samples}):
        return 0
    for i, s in enumerate(samples, 1):
        print(f"=== {i} (step {model.step}; {s['new_tokens']} new tokens, stopped on {s['stopped']})")
        print(s["prompt"] + s["completion"])
    return 0


def eval_command(args: argparse.Namespace) -> int:
    _positive(args, "limit", "batch_size")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise ConfigError(f"--data-dir {args.data_dir} is not a directory; give the folder that holds "
                          "<task>/<split>.jsonl")
    options.check_json(args.json)
    from celerity_jax.evaluate import harness, results

    content, scores = harness.score_checkpoint(args.workdir, args.step, args.tasks, args.data_dir, args.limit,
                                               args.batch_size)
    printed = options.emit_json(args.json, content)  # before the run directory: a failed write leaves it as it was
    results.write(args.workdir, content, scores)
    if printed:
        return 0
    print("\n".join(results.table(content)))
    print(f"wrote {results.result_path(args.workdir, content['step'])} and TensorBoard scalars downstream/* at step "
          f"{content['step']}")
    return 0
