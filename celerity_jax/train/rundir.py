"""The run directory: one writer at a time, the run's log file, and what makes it the same run.

`run.lock` holds the host, PID and start time of the process that writes the directory. It is held with
an exclusive `flock` for as long as that process runs, and emptied when it ends. A lock left by a process
that is gone (killed, machine rebooted) is taken over with a note when the holder ran on this host; one
left by another host cannot be checked from here, so the run stops and says which file to delete once
that process is known to have ended. (`flock` itself may not be honoured by every network filesystem;
the recorded holder is checked too.) In a multi-host run process 0 holds it.

`celerity.log` receives what libraries log (orbax, asyncio), exceptions raised in background threads and
the full tracebacks behind one-line errors. With `--verbose` or CELERITY_VERBOSE=1 they also go to the
console.
"""

import contextlib
import dataclasses
import fcntl
import gc
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
import traceback

from celerity_jax.errors import ConfigError, RunStopped
from celerity_jax.fileio import check_output_dir

LOCK_FILE = "run.lock"
LOG_FILE = "celerity.log"
KEPT_ON_ARCHIVE = (LOCK_FILE, LOG_FILE)


def verbose_from_env() -> bool:
    return os.environ.get("CELERITY_VERBOSE", "") not in ("", "0")


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc), which tells a reused PID apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(holder: dict) -> bool:
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = _process_start(holder["pid"])
    return started is None or holder.get("process_start") in (None, started)


def _describe(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on host {holder.get('host')} (started {holder.get('started')}: "
            f"{holder.get('command', '?')})")


def _read_holder(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 1 << 16).decode(errors="replace").strip()
    if not text:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        return {"pid": -1, "host": "?", "started": "?", "command": f"unreadable lock file: {text[:60]!r}"}
    return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else \
        {"pid": -1, "host": "?", "started": "?", "command": "unreadable lock file"}


@dataclasses.dataclass
class RunLock:
    workdir: str
    fd: int
    created_workdir: bool

    def release(self) -> None:
        os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        if self.created_workdir and os.listdir(self.workdir) == [LOCK_FILE]:
            os.remove(os.path.join(self.workdir, LOCK_FILE))
            os.rmdir(self.workdir)


def acquire(workdir: str, log=print) -> RunLock:
    """Takes `workdir`/run.lock (creating the workdir); refuses in one line if another process holds it."""
    check_output_dir(workdir, "--workdir")
    created = not os.path.isdir(workdir)
    path = os.path.join(workdir, LOCK_FILE)
    try:
        os.makedirs(workdir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"--workdir {workdir}: cannot create {path} ({e.strerror}); give a writable folder") \
            from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise ConfigError(f"{workdir} is in use by {_describe(holder) if holder else 'another process'}; wait "
                          "for it to end or stop it, or pass another --workdir") from None
    holder = _read_holder(fd)
    if holder is not None:
        if holder.get("host") != socket.gethostname():
            os.close(fd)
            raise ConfigError(f"{workdir} is locked by {_describe(holder)}; this host cannot check that process: "
                              f"once it has ended, delete {path} and rerun")
        if holder.get("pid") != os.getpid() and _alive(holder):
            os.close(fd)
            raise ConfigError(f"{workdir} is in use by {_describe(holder)}; wait for it to end or stop it, or "
                              "pass another --workdir")
        log(f"took over {path} from {_describe(holder)}, which is no longer running")
    mine = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
    os.fsync(fd)
    return RunLock(workdir, fd, created)


@contextlib.contextmanager
def locked(workdir: str, log=print):
    """Holds the run lock of `workdir` for the duration of the block."""
    lock = acquire(workdir, log)
    try:
        yield lock
    finally:
        lock.release()


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


def run_json_path(workdir: str) -> str:
    return os.path.join(workdir, "run.json")


def check_workdir(workdir: str, identity: dict, force_new: bool) -> bool:
    """Whether the workdir holds an earlier run to archive; refuses one that differs (read-only)."""
    path = run_json_path(workdir)
    if not os.path.exists(path):
        return False
    try:
        with open(path) as f:
            previous = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable ({e}); pass --force_new to archive this workdir's contents "
                          "inside it and start over, or use another --workdir") from None
    if force_new:
        return True
    if previous != identity:
        raise ConfigError(
            f"workdir {workdir} holds a different run ({'; '.join(diff(previous, identity)[:6])}); use another "
            "--workdir, or pass --force_new to archive the old run inside it and start over")
    return False


def archive_workdir(workdir: str, log=print) -> None:
    """Moves the previous run in the workdir into `archived-<time>/` inside it (nothing is deleted; the lock
    and the log file stay)."""
    archive = os.path.join(workdir, f"archived-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(archive)
    for name in os.listdir(workdir):
        if not name.startswith("archived-") and name not in KEPT_ON_ARCHIVE:
            shutil.move(os.path.join(workdir, name), os.path.join(archive, name))
    log(f"--force_new: moved the previous run in {workdir} to {archive}")


def diff(a, b, prefix="") -> list[str]:
    """`key: old -> new` for every leaf where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} -> {b!r}"]
