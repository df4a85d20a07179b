"""Orbax checkpoints of the train state and the data-iterator state, with a fallback on corruption.

A checkpoint holds two items: `state` (params, optimizer state, step, collapse-monitor state; one
pytree) and `data` (the JSON state of the data iterator). When the newest checkpoints are unreadable
and an older one restores, the unreadable ones are moved aside to `<workdir>/corrupt-checkpoint-<step>-
<time>` (never deleted). When none restores, nothing is moved and the run stops with an explanation.
Another run's checkpoints (TrainConfig.init_from) are only read (`checkpoint_steps`, `read_checkpoint`).
"""

import os
import shutil
import time

import jax
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from jax.experimental import multihost_utils

from celerity_jax.errors import ConfigError


def _abstract(like_state):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like_state)


def _read_only_manager(directory: str) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax warns that the directory is read-only: intended
    try:
        return ocp.CheckpointManager(os.path.abspath(directory), options=options, item_names=("state", "data"))
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
    written. With `like_state` None only the data-iterator state is read (state is None)."""
    manager = _read_only_manager(directory)
    items = {"data": ocp.args.JsonRestore()}
    if like_state is not None:
        items["state"] = ocp.args.StandardRestore(_abstract(like_state))
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # orbax raises many types for truncated files or mismatched shapes
        raise ConfigError(f"cannot read the checkpoint at step {step} in {directory} ({type(e).__name__}: "
                          f"{str(e)[:300]}); check that it is complete and was written by a run of the same "
                          "model") from e
    finally:
        manager.close()
    return restored["state"] if like_state is not None else None, restored["data"]


class Checkpointer:
    def __init__(self, directory: str, keep_last: int, keep_every: int, use_async: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep_last,
            keep_period=keep_every or None,
            enable_async_checkpointing=use_async,
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

    def save(self, step: int, state, data_state: dict) -> None:
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=True)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore_latest(self, like_state, log=print):
        """Returns (step, state, data_state) of the newest readable checkpoint, or None if there is none."""
        abstract = _abstract(like_state)
        failed = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
            except Exception as e:  # orbax raises many types for truncated files or mismatched shapes
                failed.append((step, f"{type(e).__name__}: {str(e)[:200]}"))
                continue
            self._move_aside([s for s, _ in failed], log)
            return step, restored["state"], restored["data"]
        if failed:
            raise ConfigError(
                f"none of the checkpoints in {self.directory} could be restored (step {failed[0][0]}: "
                f"{failed[0][1]}); nothing was moved or deleted. If the run's settings changed since they "
                "were written, restore them; to start over, pass --force_new (the old run is archived)")
        return None

    def _move_aside(self, steps: list[int], log) -> None:
        """Moves unreadable checkpoints out of the manager's directory (process 0 moves, all wait)."""
        if not steps:
            return
        for step in steps:
            dst = os.path.join(os.path.dirname(self.directory), f"corrupt-checkpoint-{step}-{int(time.time())}")
            if jax.process_index() == 0:
                shutil.move(os.path.join(self.directory, str(step)), dst)
            log(f"checkpoint at step {step} is unreadable; moved it to {dst} (nothing deleted) and resumed "
                "from an older one")
        multihost_utils.sync_global_devices("celerity_move_aside")
        self._manager.reload()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
