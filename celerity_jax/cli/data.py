"""`celerity prepare-data`: tokenize a corpus (or the built-in stdlib corpus) into ArrayRecord shards."""

import argparse
import json
import os
import re

from celerity_jax.data.config import DEFAULT_CHUNK_TOKENS, DEFAULT_SHARD_TOKENS, ON_BAD_RECORD

RUNNERS = ("local", "beam")


def add_commands(subparsers) -> None:
    p = subparsers.add_parser(
        "prepare-data", help="tokenize .txt/.jsonl(.gz/.zst)/.parquet files (or 'stdlib') into ArrayRecord shards",
        description="Tokenize documents into a folder of ArrayRecord shards (train and validation split) with a "
                    "manifest, which DataConfig.source='arrayrecord' reads. Uses every core; a stopped run, rerun "
                    "with the same arguments, resumes. Nothing is downloaded.")
    p.add_argument("--input", nargs="+", required=True,
                   help="files, globs or folders of .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet, or the single "
                        "word 'stdlib' for the built-in corpus")
    p.add_argument("--val-input", nargs="+", default=[],
                   help="files forming the validation split (default: a hash split of --input)")
    p.add_argument("--tokenizer", default="byte", help="'byte', a tokenizer.json or a SentencePiece .model file")
    p.add_argument("--separator-token", default="", help="token placed after each document (default: end-of-text)")
    p.add_argument("--text-column", default="text",
                   help=".jsonl key or Parquet column holding the text")
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of documents in the hash split's val")
    p.add_argument("--on-bad-record", choices=ON_BAD_RECORD, default="skip", help="malformed records and unreadable files: skip with a count, or stop naming "
                                        "the file and row")
    p.add_argument("--out", required=True,
                   help="new or empty local output folder; it appears only once complete")
    p.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS, help="tokens per record")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS,
                   help="a shard closes at the first task boundary past this many tokens (train and val together)")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="tokenizer processes (default: every core of this machine)")
    p.add_argument("--runner", choices=RUNNERS, default="local",
                   help="'local': this machine; 'beam': an Apache Beam pipeline (the `beam` extra), whose options "
                        "follow `--`, e.g. -- --runner=DataflowRunner --project=P --region=R (see Beam's pipeline options)")
    p.add_argument("beam_options", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=prepare_data_command, retain_host_memory=False)


# The DataConfig field each prepare-data flag sets: an error names the flag the user typed, not the field.
FLAGS = {"paths": "--input", "val_paths": "--val-input", "text_column": "--text-column", "tokenizer": "--tokenizer",
         "separator_token": "--separator-token", "val_fraction": "--val-fraction", "on_bad_record": "--on-bad-record"}


def in_flags(message: str) -> str:
    """`message` with each DataConfig field that a flag sets named by the flag (`DataConfig.x = 'v'` as `--x v`)."""
    for field, flag in FLAGS.items():
        message = re.sub(rf"DataConfig\.{field} = '([^']*)'", rf"{flag} \1", message)
        message = re.sub(rf"DataConfig\.{field}\b", flag, message)
    return message


def prepare_data_command(args: argparse.Namespace) -> int:
    from celerity_jax.errors import ConfigError

    try:
        return _prepare_data(args)
    except ConfigError as e:
        raise ConfigError(in_flags(str(e))) from None


def _prepare_data(args: argparse.Namespace) -> int:
    from celerity_jax.data.config import DataConfig
    from celerity_jax.errors import ConfigError

    if args.beam_options and args.runner != "beam":
        raise ConfigError(f"Beam options {args.beam_options} were given but --runner is {args.runner!r}; add "
                          "--runner beam, or drop the options")
    stdlib = args.input == ["stdlib"]
    cfg = DataConfig(source="stdlib" if stdlib else "text", paths=() if stdlib else tuple(args.input),
                     val_paths=tuple(args.val_input), text_column=args.text_column, tokenizer=args.tokenizer,
                     separator_token=args.separator_token, val_fraction=args.val_fraction,
                     on_bad_record=args.on_bad_record)
    if args.runner == "beam":
        from celerity_jax.data.beam import prepare_with_beam

        manifest = prepare_with_beam(cfg, args.out, chunk_tokens=args.chunk_tokens, shard_tokens=args.shard_tokens,
                                     beam_options=args.beam_options)
    else:
        from celerity_jax.data.prepare import prepare

        manifest = prepare(cfg, args.out, chunk_tokens=args.chunk_tokens, shard_tokens=args.shard_tokens,
                           workers=args.workers)
        print(f"prepare-data: {manifest['closing']}")
    splits = {s: {"tokens": v["tokens"], "shards": len(v["shards"])} for s, v in manifest["splits"].items()}
    print(f"prepare-data: {manifest['summary']}")
    print(json.dumps({"out": args.out, "tokenizer": manifest["tokenizer"]["name"],
                      "vocab_size": manifest["tokenizer"]["vocab_size"], "splits": splits}))
    print(f"train with DataConfig.source = 'arrayrecord', DataConfig.paths = ['{args.out}'] and DataConfig.tokenizer "
          f"= '{manifest['tokenizer']['name']}'")
    return 0
