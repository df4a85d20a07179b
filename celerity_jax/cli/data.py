"""`celerity prepare-data`: tokenize text (or the built-in stdlib corpus) into ArrayRecord shards."""

import argparse
import json


def add_commands(subparsers) -> None:
    p = subparsers.add_parser(
        "prepare-data", help="tokenize .txt/.jsonl files (or 'stdlib') into ArrayRecord shards",
        description="Tokenize documents into a folder of ArrayRecord shards (train and validation split) that "
                    "DataConfig.source='arrayrecord' reads. Nothing is downloaded.")
    p.add_argument("--input", nargs="+", required=True,
                   help="files, globs or folders of .txt/.jsonl, or the single word 'stdlib' for the built-in corpus")
    p.add_argument("--val-input", nargs="+", default=[],
                   help="files forming the validation split (default: a hash split of --input)")
    p.add_argument("--tokenizer", default="byte", help="'byte', a tokenizer.json or a SentencePiece .model file")
    p.add_argument("--separator-token", default="", help="token placed after each document (default: end-of-text)")
    p.add_argument("--text-field", default="text", help=".jsonl key holding the text")
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of documents in the hash split's val")
    p.add_argument("--on-bad-file", choices=("skip", "fail"), default="skip",
                   help="binary/undecodable files: skip with a count, or stop")
    p.add_argument("--out", required=True,
                   help="new or empty output folder (local or gs://); a local one appears only once complete")
    p.add_argument("--chunk-tokens", type=int, default=4096, help="tokens per record")
    p.add_argument("--shard-records", type=int, default=16384, help="records per shard file")
    p.set_defaults(func=prepare_data_command)


def prepare_data_command(args: argparse.Namespace) -> int:
    from celerity_jax.data.arrayrecord import prepare
    from celerity_jax.data.config import DataConfig

    stdlib = args.input == ["stdlib"]
    cfg = DataConfig(source="stdlib" if stdlib else "text", paths=() if stdlib else tuple(args.input),
                     val_paths=tuple(args.val_input), text_field=args.text_field, tokenizer=args.tokenizer,
                     separator_token=args.separator_token, val_fraction=args.val_fraction,
                     on_bad_file=args.on_bad_file)
    meta = prepare(cfg, args.out, chunk_tokens=args.chunk_tokens, shard_records=args.shard_records)
    splits = {s: {"tokens": v["tokens"], "shards": len(v["shards"])} for s, v in meta["splits"].items()}
    print(f"prepare-data: {meta['source']['summary']}")
    print(json.dumps({"out": args.out, "tokenizer": meta["tokenizer"], "vocab_size": meta["vocab_size"],
                      "splits": splits}))
    print(f"train with DataConfig.source = 'arrayrecord' and DataConfig.paths = ['{args.out}']")
    return 0
