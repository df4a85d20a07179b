import errno
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from celerity_jax.errors import ConfigError
from celerity_jax.rundir import checkpoint
from celerity_jax.train import loop


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.bool_])
def test_every_single_bit_flip_changes_the_fingerprint(dtype):
    x = (jax.random.normal(jax.random.key(0), (3, 5)) * 100).astype(dtype)
    base = checkpoint.fingerprints({"x": x})
    bits = 1 if dtype == jnp.bool_ else jnp.dtype(dtype).itemsize * 8
    words = np.asarray(x).view(np.uint8 if dtype == jnp.bool_ else f"u{jnp.dtype(dtype).itemsize}").copy()
    for index in [(0, 0), (2, 4), (1, 3)]:
        for bit in range(bits):
            flipped = words.copy()
            flipped[index] ^= 1 << bit
            assert checkpoint.fingerprints({"x": jnp.asarray(flipped.view(np.asarray(x).dtype))}) != base


def test_swapped_elements_change_the_fingerprint():
    x = jnp.arange(6.0).reshape(2, 3)
    assert checkpoint.fingerprints([x]) != checkpoint.fingerprints([x[:, ::-1]])
    assert checkpoint.fingerprints([x]) != checkpoint.fingerprints([x.T.reshape(2, 3)])


def _largest_state_file(step_dir) -> str:
    files = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(step_dir, "state")) for n in names]
    return max(files, key=os.path.getsize)


def _resume(tiny_run, workdir, messages, stop_at=25):
    return loop.train(tiny_run(f"TrainConfig.stop_at_step = {stop_at}"), workdir, log=messages.append)


def test_bit_rot_is_detected_and_the_checkpoint_moved_aside(tmp_path, tiny_run):
    workdir = str(tmp_path / "run")
    loop.train(tiny_run("TrainConfig.stop_at_step = 20"), workdir, log=lambda _: None)
    path = _largest_state_file(os.path.join(workdir, "checkpoints", "20"))
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
        f.seek(0)
        f.write(bytes(data))
    messages = []
    summary = _resume(tiny_run, workdir, messages)
    assert summary["start_step"] == 10
    assert any("step 20 is unreadable or corrupt" in m and "checksum" in m for m in messages), messages
    assert [n for n in os.listdir(workdir) if n.startswith("corrupt-checkpoint-20")]


def test_a_garbled_data_iterator_state_falls_back(tmp_path, tiny_run):
    workdir = str(tmp_path / "run")
    loop.train(tiny_run("TrainConfig.stop_at_step = 20"), workdir, log=lambda _: None)
    with open(os.path.join(workdir, "checkpoints", "20", "data", "metadata"), "w") as f:
        json.dump({"next_batch": "garbage"}, f)
    messages = []
    assert _resume(tiny_run, workdir, messages)["start_step"] == 10
    assert any("data-iterator state does not match its checksum" in m for m in messages), messages


@pytest.mark.slow  # 14 s
def test_a_checkpoint_of_another_run_is_refused(tmp_path, tiny_run):
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    loop.train(tiny_run("TrainConfig.stop_at_step = 10"), ours, log=lambda _: None)
    loop.train(tiny_run("TrainConfig.stop_at_step = 20", "RecipeConfig.base_lr = 0.1"), theirs,
               log=lambda _: None)
    os.rename(os.path.join(theirs, "checkpoints", "20"), os.path.join(ours, "checkpoints", "20"))
    with pytest.raises(ConfigError, match="step 20 .* was written by another run"):
        _resume(tiny_run, ours, [])


def test_a_failed_save_stops_the_run_at_once_naming_the_last_good_checkpoint(tmp_path, monkeypatch, curve_losses,
                                                                             tiny_run):
    workdir = str(tmp_path / "run")
    real_save = json_checkpoint_handler.JsonCheckpointHandler._save_fn

    async def disk_full_from_step_20(self, x, directory):
        if "20" in str(directory).split(os.sep)[-2:][0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return await real_save(self, x, directory)

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", disk_full_from_step_20)
    with pytest.raises(checkpoint.CheckpointSaveError) as e:
        loop.train(tiny_run("TrainConfig.stop_at_step = 40"), workdir, log=lambda _: None)
    message = str(e.value)
    assert "\n" not in message
    assert "step 20" in message and "No space left on device" in message, message
    assert "the last good checkpoint is step 10" in message and "free" in message, message
    assert max(curve_losses(workdir)) < 30  # stopped before the next checkpoint was due
    monkeypatch.undo()
    summary = loop.train(tiny_run("TrainConfig.stop_at_step = 40"), workdir, log=lambda _: None)
    assert summary["start_step"] == 10 and summary["final_step"] == 40
