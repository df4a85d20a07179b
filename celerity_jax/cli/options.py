"""Options shared by several commands, so that each means one thing everywhere.

Flags are spelled with dashes. gin's conventional `--gin_file`, `--gin_param` and the earlier `--force_new`
are accepted as hidden aliases, so existing scripts keep working.
"""

import argparse
import json

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_output_file, write_text_atomic


def _add_alias(parser: argparse.ArgumentParser, alias: str, dest: str, **kwargs) -> None:
    parser.add_argument(alias, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


def add_gin_options(parser: argparse.ArgumentParser, required: bool = True,
                    file_help: str = "gin file; repeat to layer (model, run, overrides)") -> None:
    """--gin-file (repeatable, required unless `required` is False) and --gin-param (repeatable)."""
    parser.add_argument("--gin-file", dest="gin_file", action="append", default=[], metavar="GIN",
                        help=file_help + (" (required)" if required else ""))
    _add_alias(parser, "--gin_file", "gin_file", action="append")
    parser.add_argument("--gin-param", dest="gin_param", action="append", default=[], metavar="BINDING",
                        help="one gin binding, e.g. 'TrainConfig.seed = 1'; repeatable, applied after the files")
    _add_alias(parser, "--gin_param", "gin_param", action="append")
    if required:
        parser.set_defaults(required_flags=(parser.get_default("required_flags") or []) + [("gin_file", "--gin-file")])


def add_workdir_options(parser: argparse.ArgumentParser, default: str | None = None,
                        workdir_help: str = "run directory: created, or resumed if it holds a checkpoint") -> None:
    """--workdir (required unless it has a default) and --force-new."""
    parser.add_argument("--workdir", required=default is None, default=default,
                        help=workdir_help + (f" (default {default})" if default else ""))
    parser.add_argument("--force-new", dest="force_new", action="store_true",
                        help="a run directory holding a different run is archived (inside it) and started over, "
                             "instead of refused")
    _add_alias(parser, "--force_new", "force_new", action="store_true")


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    """--json [PATH]: print `what` as JSON instead of text, or write it (atomically) to PATH."""
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help=f"print {what} as JSON instead of text, or write it as JSON to PATH")


def check_json(path: str | None) -> None:
    """Refuses, before any work, a --json PATH that cannot be written (None or '-', printing, always can)."""
    if path not in (None, "-"):
        check_output_file(path, "--json")


def emit_json(path: str | None, data) -> bool:
    """Carries out --json: prints or writes `data`; returns whether it printed (the text output is then left
    out, so that stdout stays parseable)."""
    if path is None:
        return False
    text = json.dumps(data, indent=1)
    if path == "-":
        print(text)
        return True
    write_text_atomic(path, text + "\n")
    print(f"wrote {path}")
    return False


def check_required(args: argparse.Namespace) -> None:
    """Flags that are required but have a hidden alias, which argparse's `required` cannot express."""
    for dest, flag in getattr(args, "required_flags", []):
        if not getattr(args, dest):
            raise ConfigError(f"{flag} is required; give it at least once")
