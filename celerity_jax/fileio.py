"""Atomic file writes: a file is replaced only by a complete new one, never left half-written.
Checks of input files and output folders that fail with one ConfigError line naming the fix."""

import json
import os
import tempfile

from celerity_jax.errors import ConfigError


def write_text_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json_atomic(path: str, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def save_figure_atomic(fig, path: str, **savefig_kwargs) -> None:
    """A matplotlib figure written to `path` through a temporary file that keeps the extension (it picks the
    image format)."""
    root, ext = os.path.splitext(path)
    tmp = f"{root}.tmp{os.getpid()}{ext}"
    fig.savefig(tmp, **savefig_kwargs)
    os.replace(tmp, path)


def check_local_path(path: str, what: str) -> None:
    """Run directories are written with local file I/O; a URL such as gs://bucket/run would silently
    become a local folder named `gs:`, so it is refused with the fix."""
    if "://" in str(path):
        raise ConfigError(
            f"{what}={path!r} is a URL, but run directories are written with local file I/O; mount the bucket "
            "(e.g. gcsfuse, see TPU_SETUP.md section 4) and pass the mounted local path instead")


def check_input_file(path: str, flag: str) -> None:
    """`path`, given as `flag` (an option such as '--reference', or words such as 'the file'), is an existing
    readable regular file; else one-line ConfigError naming the flag, the path, the problem and the fix."""
    if not os.path.exists(path):
        problem = "does not exist; check the path (relative paths start at the working directory)"
    elif os.path.isdir(path):
        problem = "is a folder, not a file; give the file"
    elif not os.path.isfile(path):
        problem = "is not a regular file (a pipe or device?); give a file"
    elif not os.access(path, os.R_OK):
        problem = "is not readable; fix its permissions (chmod u+r) or give another file"
    else:
        return
    raise ConfigError(f"{flag} {path} {problem}")


def check_output_dir(path: str, flag: str) -> None:
    """`path`, given as `flag`, can be an output folder: an existing writable folder, or a new one whose nearest
    existing ancestor is a writable folder. Missing folders, parents included, are for the caller to create
    (os.makedirs). Checks only; local paths only (see check_local_path). Raises a one-line ConfigError."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if existing == os.path.abspath(path) and not os.path.isdir(existing):
        raise ConfigError(f"{flag} {path} is a file, not a folder; give a new or existing folder")
    if not os.path.isdir(existing):
        raise ConfigError(f"{flag} {path}: {existing} is a file, not a folder, so no folder can be made under it; "
                          "give a path outside it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: the folder {existing} is not writable; fix its permissions or give "
                          "another folder")


def check_output_file(path: str, flag: str) -> None:
    """`path`, given as `flag`, can be written as a file: it is not a folder, and its folder exists and is
    writable (files are replaced by rename, see write_text_atomic). Raises a one-line ConfigError."""
    if not os.path.basename(path):
        raise ConfigError(f"{flag} {path or repr(path)} names no file; give a file path")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a folder; give a file path")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"{flag} {path}: {parent} is not an existing folder; create it or give another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: the folder {parent} is not writable; fix its permissions or give "
                          "another path")
