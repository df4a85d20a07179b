"""The output folder of an export or an import: built as a hidden partial folder beside it and renamed into place
when complete, so that a refused or failed command leaves nothing behind."""

import contextlib
import os
import shutil

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_local_path, check_output_dir


def check_empty(path: str, flag: str) -> None:
    """`path` is a new folder or an empty one; else one ConfigError line."""
    check_local_path(path, flag)
    check_output_dir(path, flag)
    if os.path.isdir(path) and os.listdir(path):
        raise ConfigError(f"{flag} {path} is not empty; give a new or empty folder (nothing is overwritten)")


@contextlib.contextmanager
def building(path: str, flag: str):
    """Yields the partial folder to write into; it becomes `path` when the block ends, and is removed if it raises."""
    check_empty(path, flag)
    parent, name = os.path.split(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    partial = os.path.join(parent, f".{name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)  # left by a killed command of this process id
    os.makedirs(partial)
    try:
        yield partial
        if os.path.isdir(path):
            os.rmdir(path)  # empty, as checked
        os.rename(partial, path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
