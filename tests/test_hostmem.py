import json
import os
import platform
import subprocess
import sys

import pytest

from celerity_jax import hostmem

# The allocator is changed in a child process, so this test process keeps glibc's defaults.
_CALL_TWICE = ("import dataclasses, json; from celerity_jax import hostmem; "
               "print(json.dumps([dataclasses.asdict(hostmem.retain_freed_memory()) for _ in range(2)]))")


def _call_twice(**env):
    out = subprocess.run([sys.executable, "-c", _CALL_TWICE], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's")
def test_applies_every_setting_and_is_safe_to_call_twice():
    first, second = _call_twice(**{hostmem.ENV_VAR: "1"})
    assert first == second == {"applied": {name: value for name, _, value in hostmem.SETTINGS}, "reason": ""}
    assert first["applied"]["M_MMAP_MAX"] == 0 and first["applied"]["M_ARENA_MAX"] == 1


def test_the_environment_variable_turns_it_off():
    first, second = _call_twice(**{hostmem.ENV_VAR: "0"})
    assert first == second and first["applied"] == {} and hostmem.ENV_VAR in first["reason"]
