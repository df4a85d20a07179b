"""The output folder of an export or an import: built as a hidden partial folder beside it and renamed into place
when complete, so that a refused or failed command leaves nothing behind. A killed command leaves its partial
folder: the next command writing the same folder removes it, and no command reads it."""

import contextlib
import os
import re
import shutil
import socket

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_local_path, check_output_dir
from celerity_jax.train import lock

# `.NAME.partial-HOST-PID`: the folder NAME being built by process PID on HOST (the folder may be shared by hosts).
PARTIAL = re.compile(r"\.(.+)\.partial-(.+)-(\d+)")


def check_empty(path: str, flag: str) -> None:
    """`path` is a new folder or an empty one; else one ConfigError line."""
    check_local_path(path, flag)
    check_output_dir(path, flag)
    if os.path.isdir(path) and os.listdir(path):
        raise ConfigError(f"{flag} {path} is not empty; give a new or empty folder (nothing is overwritten)")


def check_not_partial(path: str, flag: str) -> None:
    """`path` is no partial folder (of a command still running, or killed); else one ConfigError line."""
    match = PARTIAL.fullmatch(os.path.basename(os.path.abspath(path)))
    if match:
        raise ConfigError(f"{flag} {path} is the unfinished folder of a command that was killed or is still "
                          f"running; give the finished {match[1]} instead, or rerun the command that writes it")


def _remove_dead_partials(parent: str, name: str) -> None:
    """Removes the partial folders of `name` left by processes of this host that are gone; those of running ones,
    and those of other hosts (whose processes cannot be seen from here), stay."""
    for entry in os.listdir(parent):
        match = PARTIAL.fullmatch(entry)
        if not match or match[1] != name:
            continue
        host, pid = match[2], int(match[3])
        left_by_this_id = host == socket.gethostname() and pid == os.getpid()  # by a killed process that had it
        if left_by_this_id or lock.ended_here({"host": host, "pid": pid}):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


@contextlib.contextmanager
def building(path: str, flag: str):
    """Yields the partial folder to write into; it becomes `path` when the block ends, and is removed if it raises."""
    check_empty(path, flag)
    parent, name = os.path.split(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    _remove_dead_partials(parent, name)
    partial = os.path.join(parent, f".{name}.partial-{socket.gethostname()}-{os.getpid()}")
    os.makedirs(partial)
    try:
        yield partial
        try:
            if os.path.isdir(path):
                os.rmdir(path)  # empty, as checked
            os.rename(partial, path)
        except OSError as e:
            raise ConfigError(f"{flag} {path} was filled by another command while this one ran ({e.strerror}); "
                              "this one's output is discarded: give another folder") from e
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
