"""Atomic file writes: a file is replaced only by a complete new one, never left half-written."""

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


def check_local_path(path: str, what: str) -> None:
    """Run directories are written with local file I/O; a URL such as gs://bucket/run would silently
    become a local folder named `gs:`, so it is refused with the fix."""
    if "://" in str(path):
        raise ConfigError(
            f"{what}={path!r} is a URL, but run directories are written with local file I/O; mount the bucket "
            "(e.g. gcsfuse, see TPU_SETUP.md section 4) and pass the mounted local path instead")
