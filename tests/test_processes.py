"""A child that asked to die with its parent is gone when the parent is killed outright."""

import os
import signal
import subprocess
import sys

import pytest

# The parent starts a child that asks to die with it and then sleeps; the parent prints the child's PID and sleeps.
PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import sys, time; from celerity_jax.processes import die_with_parent; "
                          f"die_with_parent({os.getpid()}); print('asked', flush=True); time.sleep(300)"],
                         stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "asked"
print(child.pid, flush=True)
import time; time.sleep(300)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_ends_when_its_parent_is_killed(repo_root, gone_within):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=repo_root, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert not gone_within(child, 0)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert gone_within(child, 10)
