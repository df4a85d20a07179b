"""Orbax checkpoints of the train state and the data-iterator state, with integrity checks and a fallback.

A checkpoint holds three items: `state` (params, optimizer state, step, collapse-monitor state; one
pytree), `data` (the JSON state of the data iterator) and `integrity` (JSON): the identity of the run
that wrote it, a 64-bit fingerprint of every state array (computed on the devices, see `fingerprints`)
and a SHA-256 of the data state. A restore recomputes both and compares.

When the newest checkpoints are unreadable or fail their checks and an older one passes, the bad ones
are moved aside to `<workdir>/corrupt-checkpoint-<step>-<time>` (never deleted). When none passes,
nothing is moved and the run stops with an explanation. A checkpoint written by another run is refused.
Another run's checkpoints (TrainConfig.init_from) are only read (`checkpoint_steps`, `read_checkpoint`).
"""

import hashlib
import json
import logging
import os
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from jax import lax
from jax.experimental import multihost_utils

from celerity_jax.errors import ConfigError, RunStopped
from celerity_jax.rundir.identity import Identity

ITEMS = ("state", "data", "integrity")
_log = logging.getLogger(__name__)


class CheckpointSaveError(RunStopped):
    """Writing a checkpoint failed (disk full, permissions): the run stops at once."""
    exit_code = 4


def _words(x):
    """The array's bits as uint32, element by element."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _fingerprint(x):
    """Two position-weighted sums of the array's bits mod 2**32. Any single flipped bit changes the first
    (its weight is odd); the indices are built from iotas, so a sharded array is never reshaped."""
    words = _words(x)
    index, stride = jnp.zeros(x.shape, jnp.uint32), 1
    for axis in reversed(range(x.ndim)):
        index = index + lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride % 2**32)
        stride *= x.shape[axis]
    first = jnp.sum(words * (2 * index + 1) * jnp.uint32(0x9E3779B1), dtype=jnp.uint32)
    second = jnp.sum((words ^ (index * jnp.uint32(0x85EBCA6B))) * jnp.uint32(0xC2B2AE35), dtype=jnp.uint32)
    return jnp.stack([first, second])


@jax.jit
def _fingerprint_tree(state):
    return jax.tree.map(_fingerprint, state)


def fingerprints(state) -> dict[str, str]:
    """{array path: 16 hex digits} of a state pytree."""
    sums = jax.device_get(_fingerprint_tree(state))
    return {jax.tree_util.keystr(path): f"{int(a):08x}{int(b):08x}"
            for path, (a, b) in jax.tree_util.tree_flatten_with_path(sums)[0]}


def data_digest(data_state: dict) -> str:
    return hashlib.sha256(json.dumps(data_state, sort_keys=True).encode()).hexdigest()


def integrity_record(state, data_state: dict, identity: dict) -> dict:
    return {"identity": identity, "state": fingerprints(state), "data": data_digest(data_state)}


def integrity_problem(record: dict, state, data_state: dict) -> str | None:
    """What fails the checks of `record` (None if nothing): which arrays, or the data state."""
    if not isinstance(record, dict) or not isinstance(record.get("state"), dict):
        return "its integrity record is malformed"
    actual = fingerprints(state)
    bad = sorted(k for k in set(actual) | set(record["state"]) if actual.get(k) != record["state"].get(k))
    if bad:
        return f"{len(bad)} array(s) do not match their checksums ({', '.join(bad[:3])})"
    if record.get("data") != data_digest(data_state):
        return "the data-iterator state does not match its checksum"
    return None


def _abstract(like_state):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like_state)


def _root_cause(e: BaseException) -> str:
    """The innermost cause's first line: orbax wraps tensorstore errors in long reprs."""
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"


def _has_integrity(directory: str, step: int) -> bool:
    return os.path.isdir(os.path.join(directory, str(step), "integrity"))


def _restore_args(like_state, with_integrity: bool):
    items = {"state": ocp.args.StandardRestore(_abstract(like_state)), "data": ocp.args.JsonRestore()}
    if with_integrity:
        items["integrity"] = ocp.args.JsonRestore()
    return ocp.args.Composite(**items)


def _read_only_manager(directory: str) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax warns that the directory is read-only: intended
    try:
        return ocp.CheckpointManager(os.path.abspath(directory), options=options, item_names=ITEMS)
    finally:
        absl_logging.set_verbosity(verbosity)


def checkpoint_steps(directory: str) -> list[int]:
    """Steps of the checkpoints in `directory` (read-only; [] when there is none)."""
    if not os.path.isdir(directory):
        return []
    manager = _read_only_manager(directory)
    try:
        return sorted(manager.all_steps())
    finally:
        manager.close()


def read_checkpoint(directory: str, step: int, like_state=None):
    """(state, data_state) of the checkpoint at `step`, read-only: nothing in `directory` is moved or
    written. With `like_state` None only the data-iterator state is read (state is None). The state is
    checked against its checksums (the run identity is not: the reader is another run)."""
    manager = _read_only_manager(directory)
    checked = like_state is not None and _has_integrity(directory, step)
    items = {"data": ocp.args.JsonRestore()}
    if like_state is not None:
        items["state"] = ocp.args.StandardRestore(_abstract(like_state))
    if checked:
        items["integrity"] = ocp.args.JsonRestore()
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # orbax raises many types for truncated files or mismatched shapes
        _log.warning("reading the checkpoint at step %d in %s failed", step, directory, exc_info=True)
        raise ConfigError(f"cannot read the checkpoint at step {step} in {directory} ({_root_cause(e)}); check "
                          "that it is complete and was written by a run of the same model") from None
    finally:
        manager.close()
    if checked and (problem := integrity_problem(restored["integrity"], restored["state"], restored["data"])):
        raise ConfigError(f"the checkpoint at step {step} in {directory} is corrupt: {problem}; pick an older one "
                          "(TrainConfig.init_from = '<run>/checkpoints/<step>')")
    return restored["state"] if like_state is not None else None, restored["data"]


def _quiet_abandoned_reads(previous):
    """sys.unraisablehook while parameters are read, and after a failed read: tensorstore then completes the reads
    orbax abandoned and posts each to orbax's event loop, already closed, which Python reports as an unraisable
    'Event loop is closed', at any time until exit. Those reports go to this module's debug log; any other to
    `previous`."""
    def hook(report):
        if isinstance(report.exc_value, RuntimeError) and str(report.exc_value) == "Event loop is closed":
            _log.debug("a read abandoned by a failed restore completed",
                       exc_info=(report.exc_type, report.exc_value, report.exc_traceback))
        else:
            previous(report)

    return hook


def read_params(directory: str, step: int, like_params):
    """The parameters of the checkpoint at `step`, without the optimizer state, read-only, laid out as
    `like_params` (arrays or ShapeDtypeStructs with shardings). They are checked against their checksums where
    the checkpoint has them; a checkpoint that fails the check is refused (ConfigError)."""
    target = {"params": _abstract(like_params)}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax warns that the item has no metadata file of its own
    unraisablehook = sys.unraisablehook
    sys.unraisablehook = _quiet_abandoned_reads(unraisablehook)
    try:
        state_dir = os.path.join(os.path.abspath(directory), str(step), "state")
        with ocp.PyTreeCheckpointer() as reader:
            params = reader.restore(state_dir, args=ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args, partial_restore=True))["params"]
        record = None
        if _has_integrity(directory, step):
            manager = _read_only_manager(directory)
            try:
                record = manager.restore(step, args=ocp.args.Composite(integrity=ocp.args.JsonRestore()))["integrity"]
            finally:
                manager.close()
    except Exception as e:  # orbax raises many types for truncated files or mismatched shapes
        # The hook stays for the abandoned reads. Chained, not logged: the one-line refusal stands alone, and
        # CELERITY_VERBOSE=1 shows orbax's traceback.
        raise ConfigError(f"cannot read the parameters of the checkpoint at step {step} in {directory} "
                          f"({_root_cause(e)}); check that it is complete and matches the run's run.json") from e
    finally:
        absl_logging.set_verbosity(verbosity)
    sys.unraisablehook = unraisablehook
    if record is not None:
        expected = record.get("state") if isinstance(record, dict) else None
        problem = "its integrity record is malformed" if not isinstance(expected, dict) else None
        if problem is None:
            actual = {".params" + path: fp for path, fp in fingerprints(params).items()}
            bad = sorted(k for k in actual if actual[k] != expected.get(k))
            problem = f"{len(bad)} array(s) do not match their checksums ({', '.join(bad[:3])})" if bad else None
        if problem:
            raise ConfigError(f"the checkpoint at step {step} in {directory} is corrupt: {problem}; pick another "
                              "saved step")
    return params


def _directory_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


class Checkpointer:
    """The run's own checkpoints: save (asynchronously by default) and restore the newest good one."""

    def __init__(self, directory: str, identity: Identity, keep_last: int, keep_every: int, use_async: bool = True):
        self.directory = os.path.abspath(directory)
        self.identity = identity
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep_last,
            keep_period=keep_every or None,
            enable_async_checkpointing=use_async,
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        self._pending_step = None  # a save that may still be running in the background

    def save(self, step: int, state, data_state: dict) -> None:
        self.wait_until_saved()
        record = integrity_record(state, data_state, self.identity.record)
        self._pending_step = step
        try:
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
                integrity=ocp.args.JsonSave(record)), force=True)
        except Exception as e:  # orbax and tensorstore raise many types for a failed write
            raise self._save_error(step, e) from None

    def wait_until_saved(self) -> None:
        """Blocks until a background save has finished; raises CheckpointSaveError if it failed."""
        if self._pending_step is not None:
            self._wait_for_pending()

    def check_for_errors(self) -> None:
        """Raises CheckpointSaveError once a background save has failed (cheap: call it every step)."""
        if self._pending_step is not None and not self._manager.is_saving_in_progress():
            self._wait_for_pending()

    def _wait_for_pending(self) -> None:
        step, self._pending_step = self._pending_step, None
        try:
            self._manager.wait_until_finished()  # re-raises what failed in the background
            self._manager.check_for_errors()
        except Exception as e:
            raise self._save_error(step, e) from None

    def _save_error(self, step: int, e: Exception) -> CheckpointSaveError:
        _log.error("saving the checkpoint at step %s failed", step, exc_info=e)
        good = [s for s in self._manager.all_steps() if s != step]
        sizes = [_directory_bytes(os.path.join(self.directory, str(s))) for s in good]
        need = f"one checkpoint takes {_gb(max(sizes))}" if sizes else "no checkpoint has been written yet"
        free = shutil.disk_usage(self.directory).free if os.path.isdir(self.directory) else 0
        last = f"the last good checkpoint is step {max(good)}" if good else "there is no good checkpoint yet"
        return CheckpointSaveError(
            f"saving the checkpoint at step {step} in {self.directory} failed ({_root_cause(e)}); {_gb(free)} "
            f"free, {need}; {last}. Free space (or fix permissions) and rerun the same command")

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore_latest(self, like_state, log=print):
        """Returns (step, state, data_state) of the newest checkpoint that reads and passes its checks, or None
        if there is none. A checkpoint that another run wrote stops the run (ConfigError)."""
        failed = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            checked = _has_integrity(self.directory, step)
            try:
                restored = self._manager.restore(step, args=_restore_args(like_state, checked))
            except Exception as e:  # orbax raises many types for truncated files or mismatched shapes
                _log.warning("restoring the checkpoint at step %d failed", step, exc_info=True)
                failed.append((step, _root_cause(e)))
                continue
            if checked:
                record = restored["integrity"]
                if isinstance(record, dict) and not (isinstance(record.get("identity"), dict)
                                                     and self.identity.same_run(record["identity"])):
                    raise ConfigError(
                        f"the checkpoint at step {step} in {self.directory} was written by another run; move it "
                        "out of that folder, or start from it in a new workdir with TrainConfig.init_from")
                if problem := integrity_problem(record, restored["state"], restored["data"]):
                    failed.append((step, problem))
                    continue
            else:
                log(f"the checkpoint at step {step} has no checksums (written by an older celerity_jax): "
                    "resumed without verifying it")
            self._move_aside(failed, log)
            return step, restored["state"], restored["data"]
        if failed:
            raise ConfigError(
                f"none of the checkpoints in {self.directory} could be restored (step {failed[0][0]}: "
                f"{failed[0][1]}); nothing was moved or deleted. If the run's settings changed since they "
                "were written, restore them; to start over, pass --force-new (the old run is archived)")
        return None

    def _move_aside(self, failed: list[tuple[int, str]], log) -> None:
        """Moves unreadable checkpoints out of the manager's directory (process 0 moves, all wait)."""
        if not failed:
            return
        for step, why in failed:
            dst = os.path.join(os.path.dirname(self.directory), f"corrupt-checkpoint-{step}-{int(time.time())}")
            if jax.process_index() == 0:
                shutil.move(os.path.join(self.directory, str(step)), dst)
            log(f"the checkpoint at step {step} is unreadable or corrupt ({why}); moved it to {dst} (nothing "
                "deleted) and resumed from an older one")
        multihost_utils.sync_global_devices("celerity_move_aside")
        self._manager.reload()

    def close(self, raise_errors: bool = True) -> None:
        """Waits for a pending save; raises CheckpointSaveError if it failed (or, without `raise_errors`, as
        when the run is already stopping on another error, only logs it)."""
        try:
            self.wait_until_saved()
        except CheckpointSaveError:
            if raise_errors:
                raise
        finally:
            self._manager.close()
