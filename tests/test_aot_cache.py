"""Compile results kept on disk, keyed by the program."""

import os

import jax
import jax.numpy as jnp

from celerity_jax.aot.cache import Cache


def test_a_program_is_computed_once_and_a_changed_one_again(tmp_path):
    calls = []
    compute = lambda: calls.append(1) or {"bytes": len(calls)}  # noqa: E731
    double = jax.jit(lambda x: 2 * x).lower(jnp.ones(4))
    cache = Cache(str(tmp_path))
    assert cache("step", double, "v5e-4", compute) == {"bytes": 1}
    assert cache("step", double, "v5e-4", compute) == {"bytes": 1} and len(calls) == 1
    assert len(os.listdir(tmp_path)) == 1
    assert cache("step", double, "v5p-8", compute) == {"bytes": 2}  # another target
    assert cache("step", jax.jit(lambda x: 3 * x).lower(jnp.ones(4)), "v5e-4", compute) == {"bytes": 3}
    assert Cache(None)("step", double, "v5e-4", compute) == {"bytes": 4} and len(os.listdir(tmp_path)) == 3
