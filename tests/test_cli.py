"""The command line as a whole: every command registered, one flag style (every flag a `--help` shows is spelled
with dashes), and a `--help` that imports nothing heavy."""

import argparse
import re
import subprocess
import sys

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


def test_help_lists_every_command_and_imports_no_jax(repo_root):
    code = ("import sys, contextlib, io\n"
            "from celerity_jax.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
            "    main(['--help'])\n"
            "print(sorted(m for m in ('jax', 'numpy', 'gin', 'tensorboard', 'lm_eval') if m in sys.modules))\n"
            "print(out.getvalue())")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    heavy, help_text = out.stdout.split("\n", 1)
    assert heavy == "[]"
    listed = re.search(r"\{([a-z,-]+)\}", help_text).group(1).split(",")
    assert listed == [name for module in cli.COMMANDS for name in _added_commands(module)]


def _added_commands(module) -> list[str]:
    """The commands a command module adds, in order."""
    subparsers = argparse.ArgumentParser().add_subparsers()
    module.add_commands(subparsers)
    return list(subparsers.choices)



def test_celerity_verbose_prints_the_traceback_of_the_refusal(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CELERITY_VERBOSE", "1")
    assert cli.main(["demo", "--workdir", str(tmp_path / "demo"), "--sizes", "d40-l2,d999"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ConfigError: no size file" in err
    assert err.strip().splitlines()[-1].startswith("celerity demo: error: no size file")


def test_a_reader_that_stops_reading_ends_the_command_quietly(repo_root):
    plan = subprocess.Popen([sys.executable, "-m", "celerity_jax.cli", "plan", "--gin-file",
                             "experiments/celerity/300m_80tpp.gin", "--json"], cwd=repo_root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    plan.stdout.close()  # as `| head` does, before anything is written
    assert plan.wait(timeout=120) == 141
    assert plan.stderr.read() == b""
