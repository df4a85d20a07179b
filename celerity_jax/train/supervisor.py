"""A multi-host `celerity train` that loses a process stops with one line instead of a stack trace.

JAX's distributed runtime notices a process that stops sending heartbeats (`--heartbeat-timeout`) and then
aborts every other process from C++ (SIGABRT, a stack trace), which Python cannot catch. So each process trains in
a child of itself: the parent passes the child's output through, and when the child was aborted by the runtime it
drops the stack trace and says, in one line, which process was lost and how to restart. The data guarantees are
the trainer's: nothing is written past the last checkpoint, and rerunning every process with the same command
resumes from it.
"""

import os
import re
import signal
import subprocess
import sys

from celerity_jax.errors import RunStopped
from celerity_jax.processes import die_with_parent

CHILD_ENV = "CELERITY_SUPERVISED"  # set in the child, which trains itself: the supervising parent's PID
_UNHEALTHY = "The following tasks are unhealthy"
# What the runtime logs as it gives up on the run: a lost task reported by the coordinator, or the coordinator
# itself gone (when process 0 is the one lost).
_RUNTIME_FAILURE = (_UNHEALTHY, "Terminating process because the JAX distributed service detected fatal errors",
                    "Polled an error from coordination service", "Failed to send heartbeat")


class ProcessLost(RunStopped):
    """Another process of a multi-host run stopped answering; this one stopped too."""
    exit_code = 5


def is_child() -> bool:
    return bool(os.environ.get(CHILD_ENV))


def end_with_supervisor() -> None:
    """In the child: it ends when its supervisor does, even one killed outright (SIGKILL), rather than train on
    as an orphan holding the accelerators and the run lock."""
    die_with_parent(int(os.environ[CHILD_ENV]))


def lost_processes(stderr_lines: list[str]) -> list[int]:
    """The process indices the runtime reported as unhealthy (the lines after its "unhealthy" line)."""
    lost = []
    for i, line in enumerate(stderr_lines):
        if _UNHEALTHY in line:
            for following in stderr_lines[i + 1:]:
                ids = re.findall(r"(?:task:)?(\d+)\s*$", following.strip())
                if not ids:
                    break
                lost.append(int(ids[0]))
            break
    return sorted(set(lost))


def relay(stderr, out) -> tuple[list[str], bool]:
    """Passes the child's stderr lines to `out` until the runtime says it is aborting the run; returns every line
    and whether it aborted. A Python traceback is held until the stream ends and dropped if the run aborted: a
    collective that fails because a peer is gone raises one ("Gloo all-reduce failed: Connection reset by peer")
    just before the runtime reports the lost process."""
    lines, held, aborting = [], [], False
    for line in stderr:
        lines.append(line)
        aborting = aborting or any(marker in line for marker in _RUNTIME_FAILURE)
        if held or line.startswith("Traceback (most recent call last)"):
            held.append(line)
        elif not aborting:
            out.write(line)
            out.flush()
    if not aborting:
        out.writelines(held)
    return lines, aborting


def train_supervised(argv: list[str], process_id: int | None, heartbeat_timeout: int) -> int:
    """Runs `celerity <argv>` in a child process; returns its exit code, or raises ProcessLost when the distributed
    runtime aborted it because another process was lost."""
    child = subprocess.Popen([sys.executable, "-m", "celerity_jax.cli", *argv], env={**os.environ, CHILD_ENV: str(os.getpid())},
                             stderr=subprocess.PIPE, text=True, errors="replace")
    # Ctrl-C reaches the child from the terminal itself; the child saves a checkpoint and exits.
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    try:
        lines, aborting = relay(child.stderr, sys.stderr)
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    if not aborting:
        return code
    lost = lost_processes(lines)
    me = f"process {process_id}" if process_id is not None else "this process"
    who = (f"process {', '.join(map(str, lost))} of this run sent no heartbeat for {heartbeat_timeout} s" if lost
           else "the run's coordinator (process 0) is gone or reported a failed process")
    raise ProcessLost(f"{who}, so {me} stopped; nothing is written past the last checkpoint: restart every process "
                      "with the same command to resume from it")
