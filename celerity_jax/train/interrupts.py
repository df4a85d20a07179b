"""Ctrl-C (SIGINT) during `train`: a request to stop, honoured at the next safe point.

The first interrupt sets a flag and raises nothing, so it cannot land inside a compilation or a
garbage-collector callback. Startup checks the flag between its phases (`raise_if_requested`: stops
without a checkpoint); the loop checks it after every step (saves a checkpoint, then stops). Either way
`train` raises `Interrupted`, so every caller (sweep, demo, experiments) stops too. A second interrupt
exits at once, without saving.
"""

import contextlib
import os
import signal
import threading

from celerity_jax.errors import RunStopped

EXIT_CODE = 130  # the shell's code for a SIGINT

_requested = False
_depth = 0


class Interrupted(RunStopped):
    """A run stopped on Ctrl-C; the message says whether a checkpoint was saved."""
    exit_code = EXIT_CODE


def _on_sigint(signum, frame):
    global _requested
    if _requested:
        os.write(2, b"\ninterrupted again: exiting now, without saving\n")
        os._exit(EXIT_CODE)
    _requested = True
    os.write(2, b"\ninterrupt: stopping at the next safe point (Ctrl-C again to exit at once)\n")


def requested() -> bool:
    return _requested


def raise_if_requested() -> None:
    if _requested:
        raise Interrupted("interrupted before the first step: nothing was saved; rerun the same command to start")


@contextlib.contextmanager
def handled():
    """SIGINT sets the flag inside the block (main thread only, and not where SIGINT is ignored; elsewhere a
    no-op). Nested blocks share the outermost handler; the outermost block restores the previous handler and
    clears the flag."""
    global _requested, _depth
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield  # a background job started by a shell ignores SIGINT: keep it so
        return
    previous = signal.signal(signal.SIGINT, _on_sigint) if _depth == 0 else None
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            signal.signal(signal.SIGINT, previous)
            _requested = False
