"""Orbax checkpoints of the train state and the data-iterator state, with a fallback on corruption.

A checkpoint holds two items: `state` (params, optimizer state, step, collapse-monitor state; one
pytree) and `data` (the JSON state of the data iterator). An unreadable checkpoint is moved aside to
`<dir>/corrupt-<step>` (never deleted) and the previous one is used.
"""

import os
import shutil
import time

import jax
import orbax.checkpoint as ocp


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
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like_state)
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
            except Exception as e:  # orbax raises many types for truncated or missing files
                moved = self._move_aside(step)
                log(f"checkpoint at step {step} is unreadable ({type(e).__name__}: {str(e)[:200]}); "
                    f"moved it to {moved} (nothing deleted) and trying the previous checkpoint")
                continue
            return step, restored["state"], restored["data"]
        return None

    def _move_aside(self, step: int) -> str:
        src = os.path.join(self.directory, str(step))
        dst = os.path.join(os.path.dirname(self.directory), f"corrupt-checkpoint-{step}-{int(time.time())}")
        shutil.move(src, dst)
        self._manager.reload()
        return dst

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
