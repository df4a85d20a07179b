"""Child processes that end with the process that started them.

A process killed outright (SIGKILL) runs no cleanup, so its children would live on: a supervised trainer holding
the accelerators and the run lock, or search workers compiling for minutes. On Linux the kernel can send a child a
signal when its parent dies (prctl PR_SET_PDEATHSIG); elsewhere this does nothing.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """The kernel kills this process (SIGKILL) when its parent dies; it exits at once if the parent `parent_pid` is
    already gone (it died before this process asked)."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)
