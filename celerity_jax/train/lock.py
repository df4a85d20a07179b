"""One writer per run directory: `run.lock`.

`run.lock` holds the host, PID and start time of the process that writes the directory. It is held with
an exclusive `flock` for as long as that process runs, and emptied when it ends. A lock left by a process
that is gone (killed, machine rebooted) is taken over with a note when the holder ran on this host; one
left by another host cannot be checked from here, so the run stops and says which file to delete once
that process is known to have ended. (`flock` itself may not be honoured by every network filesystem;
the recorded holder is checked too.) In a multi-host run process 0 holds it.
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import sys
import time

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_output_dir
from celerity_jax.rundir import LOCK_FILE


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc), which tells a reused PID apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def this_process() -> dict:
    """The host, PID and start time of this process, as a lock records its holder."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid())}


def ended_here(holder: dict) -> bool:
    """Whether `holder` (a `this_process()` of some process) ran on this host and has ended."""
    return holder.get("host") == socket.gethostname() and not _alive(holder)


def _alive(holder: dict) -> bool:
    try:
        os.kill(holder["pid"], 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no process has so large an id
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
    mine = {**this_process(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)}
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
