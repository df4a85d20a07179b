"""One flag style for the whole command line: every flag a `--help` shows is spelled with dashes."""

import argparse
import re

from celerity_jax import cli

UNDERSCORE_FLAG = re.compile(r"(?<![\w-])--[a-z0-9]+(?:-[a-z0-9]+)*_[a-z0-9_-]*")


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command words, parser) of every command and subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _commands(sub, (*prefix, name))


def test_every_help_shows_only_dashed_flags():
    commands = dict(_commands(cli.build_parser()))
    assert {("plan",), ("compile",), ("prepare-data",), ("coordcheck",), ("train",)} <= set(commands)
    assert any(words[0] == "collapse" and len(words) == 2 for words in commands)  # its subcommands are walked
    offenders = {" ".join(words): UNDERSCORE_FLAG.findall(sub.format_help())
                 for words, sub in commands.items()}
    assert not {name: flags for name, flags in offenders.items() if flags}
