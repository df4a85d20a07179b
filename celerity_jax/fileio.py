"""Atomic file writes: a file is replaced only by a complete new one, never left half-written."""

import json
import os
import tempfile


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
