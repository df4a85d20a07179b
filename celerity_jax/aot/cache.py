"""Compile results kept on disk, so that a rerun of `celerity compile` or of a search compiles nothing again."""

import hashlib
import json
import os

import jax

from celerity_jax.accelerators import libtpu_version
from celerity_jax.fileio import write_json_atomic

DEFAULT_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "celerity", "compile")


class Cache:
    """One JSON file per compiled program, named by the program's text, the target devices, the compiler's
    options and versions (any change to what is compiled makes a new entry); Cache(None) keeps nothing."""

    def __init__(self, directory: str | None):
        self.directory = directory

    def __call__(self, piece: str, lowered, target: str, compute, compiler_options: dict | None = None):
        """compute()'s (JSON-able) result for this lowered program on `target`, compiled with `compiler_options`,
        from disk when known."""
        key = {"piece": piece, "program": hashlib.sha256(lowered.as_text().encode()).hexdigest(), "target": target,
               "jax": jax.__version__, "libtpu": libtpu_version(), "compiler_options": compiler_options or {}}
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        path = os.path.join(self.directory, f"{name}.json") if self.directory else None
        if path and os.path.exists(path):
            with open(path) as f:
                return json.load(f)["value"]
        value = compute()
        if path:
            os.makedirs(self.directory, exist_ok=True)
            write_json_atomic(path, {"key": key, "value": value})
        return value
