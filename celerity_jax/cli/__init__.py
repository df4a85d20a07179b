"""The `celerity` command line: one thin module per command group.

Each module in COMMANDS exposes `add_commands(subparsers)`; every subcommand sets `func(args)`. The command
modules import only the standard library and light project modules at the top, so that `celerity --help` stays
fast (a test checks that it imports no JAX); each command imports what it runs. Shared options are in
`options.py`. Gin is parsed only by the commands that take `--gin-file` (see `celerity_jax.gin_config`).
"""

import argparse
import os
import sys
import traceback

from celerity_jax import hostmem
from celerity_jax.cli import collapse, coordcheck, data, demo, evaluate, frontier, hf, options, plan, sweep, train
from celerity_jax.cli import compile as compile_  # as `compile` it would hide the builtin
from celerity_jax.errors import DISK_ERRNOS, ConfigError, RunStopped
from celerity_jax.train.logfile import verbose_from_env

COMMANDS = (coordcheck, plan, data, collapse, train, demo, sweep, compile_, evaluate, frontier, hf)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="celerity", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_commands(subparsers)
    return parser


def main(argv=None) -> int:
    """Runs one command. Errors a user can act on print one line (with CELERITY_VERBOSE=1, the traceback too)."""
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print("celerity: interrupted", file=sys.stderr)
        return 130
    if getattr(args, "retain_host_memory", True):
        # before JAX allocates (CELERITY_RETAIN_HOST_MEMORY=0 turns it off); commands that run many threads
        # without XLA opt out: its single malloc arena serializes their allocations
        hostmem.retain_freed_memory()
    verbose = getattr(args, "verbose", False) or verbose_from_env()
    try:
        options.check_required(args)
        return int(args.func(args) or 0)
    except ConfigError as e:
        message, code, error = f"error: {e}", 2, e
    except RunStopped as e:
        message, code, error = str(e), e.exit_code, e
    except KeyboardInterrupt as e:
        message, code, error = "interrupted", 130, e
    except BrokenPipeError:  # whatever read stdout stopped (`| head`): end quietly, as other Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        if e.errno not in DISK_ERRNOS:
            raise
        where = f" ({e.filename})" if e.filename else ""
        message, code, error = f"error: {e.strerror}{where}; free space or fix permissions, then rerun", 2, e
    if verbose:
        traceback.print_exception(error)
    print(f"celerity {args.command}: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
