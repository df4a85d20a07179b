"""The `celerity` command line: each job's module registers its own subcommands.

A module in COMMAND_MODULES exposes `add_commands(subparsers)`; every subcommand sets `func(args)`.
Gin is parsed only by the commands that take `--gin_file` (see `celerity_jax.gin_config`).
"""

import argparse
import importlib
import sys

from celerity_jax import hostmem
from celerity_jax.errors import ConfigError

COMMAND_MODULES = (
    "celerity_jax.model.commands",
    "celerity_jax.recipe_cli",
    "celerity_jax.data.cli",
    "celerity_jax.collapse.commands",
    "celerity_jax.train_cli",
    "celerity_jax.demo",
    "celerity_jax.sweep",
    "celerity_jax.aot.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="celerity", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(subparsers)
    return parser


def main(argv=None) -> int:
    hostmem.retain_freed_memory()  # first, before JAX allocates (CELERITY_RETAIN_HOST_MEMORY=0 turns it off)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"celerity {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
