"""`celerity.log`: where library output goes during a run, so that the console shows only the run's own lines.

It receives what libraries log (orbax, asyncio), exceptions raised in background threads and the full
tracebacks behind one-line errors. With `--verbose` or CELERITY_VERBOSE=1 they also go to the console.
Standard library only: `celerity --help` imports this module.
"""

import contextlib
import gc
import logging
import os
import sys
import threading
import traceback

from celerity_jax.errors import ConfigError, RunStopped
from celerity_jax.rundir import LOG_FILE


def verbose_from_env() -> bool:
    return os.environ.get("CELERITY_VERBOSE", "") not in ("", "0")


class _QuietFileHandler(logging.FileHandler):
    """Drops a record it cannot write (the disk is full) instead of printing logging's own traceback."""

    def handleError(self, record):
        pass


def send_library_output_to_log(workdir: str, verbose: bool = False):
    """Sends Python logging, unraisable exceptions and background-thread exceptions to `workdir`/celerity.log
    (opened at the first record); with `verbose` the console keeps them too. Returns the function that
    undoes it. The CLI never undoes it: orbax's failed reads are collected as late as interpreter shutdown."""
    handler = _QuietFileHandler(os.path.join(workdir, LOG_FILE), delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("celerity")
    root = logging.getLogger()
    saved = root.handlers[:], sys.unraisablehook, threading.excepthook

    def unraisable(u):
        log.error("unraisable exception in %r", u.object, exc_info=(u.exc_type, u.exc_value, u.exc_traceback))
        if verbose:
            saved[1](u)

    def thread_exception(a):
        log.error("exception in thread %s", a.thread and a.thread.name,
                  exc_info=(a.exc_type, a.exc_value, a.exc_traceback))
        if verbose:
            saved[2](a)

    def undo():
        gc.collect()  # failed background tasks report when collected: into the log, not after it is closed
        root.handlers, sys.unraisablehook, threading.excepthook = saved
        handler.close()

    root.handlers = saved[0] + [handler] if verbose else [handler]
    sys.unraisablehook, threading.excepthook = unraisable, thread_exception
    return undo


@contextlib.contextmanager
def library_output_to_log(workdir: str, verbose: bool = False):
    """`send_library_output_to_log` for the duration of the block, with the traceback of an unexpected error."""
    undo = send_library_output_to_log(workdir, verbose)
    try:
        yield os.path.join(workdir, LOG_FILE)
    except (ConfigError, RunStopped):
        raise
    except Exception:
        logging.getLogger("celerity").error("the run stopped:\n%s", traceback.format_exc())
        raise
    finally:
        undo()
