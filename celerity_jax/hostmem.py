"""Make glibc keep freed host memory for reuse, so XLA:CPU's per-step temporaries are not page-faulted in again
every step.

XLA:CPU allocates a step's temporaries as large blocks. By default glibc serves each with a fresh mmap and
unmaps it when freed, so every step touches (and the kernel zero-fills) all of it again. `retain_freed_memory`
sets, through `mallopt`: one arena (M_ARENA_MAX 1), no mmap for large blocks (M_MMAP_MAX 0), never give the
heap top back (M_TRIM_THRESHOLD −1), and grow the heap 1 GiB at a time (M_TOP_PAD). The cost: the process
keeps its peak heap resident. The train-step results (docs/results/training.md) give the page faults and memory it
saves and costs. Call it before JAX allocates (the `celerity` command line calls it once the arguments are parsed, for
every command but `prepare-data`, whose tokenizer threads would queue on the one arena); set
CELERITY_RETAIN_HOST_MEMORY=0 to turn it off.
"""

import ctypes
import dataclasses
import os
import platform
import sys

ENV_VAR = "CELERITY_RETAIN_HOST_MEMORY"

# Option numbers from glibc's <malloc.h>.
SETTINGS = (("M_ARENA_MAX", -8, 1), ("M_MMAP_MAX", -4, 0), ("M_TRIM_THRESHOLD", -1, -1),
            ("M_TOP_PAD", -2, 2**30))


@dataclasses.dataclass(frozen=True)
class HostMemory:
    applied: dict  # mallopt option name -> value set; empty when nothing changed
    reason: str  # why nothing (or not everything) was applied; "" when all was


def retain_freed_memory() -> HostMemory:
    """Apply SETTINGS through glibc's mallopt (idempotent: a second call sets the same values again)."""
    if os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return HostMemory({}, f"turned off by {ENV_VAR}={os.environ[ENV_VAR]}")
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return HostMemory({}, f"not glibc on Linux ({sys.platform}, {platform.libc_ver()[0] or 'unknown libc'}); "
                              "the allocator is left as it is")
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError) as e:
        return HostMemory({}, f"glibc's mallopt is not reachable ({e}); the allocator is left as it is")
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    applied = {name: value for name, option, value in SETTINGS if mallopt(option, value) == 1}
    failed = [name for name, _, _ in SETTINGS if name not in applied]
    return HostMemory(applied, f"mallopt refused {', '.join(failed)}" if failed else "")
