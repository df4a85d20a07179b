"""The run directory of an imported model: the run files of its definition, model.gin and a checkpoint at step 0
holding the given state."""

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np

from celerity_jax import rundir
from celerity_jax.rundir import checkpoint, imported


def test_the_run_files_model_gin_and_the_state_at_step_0(tmp_path, tiny_run):
    definition = dataclasses.replace(tiny_run(), operative_gin="# the operative gin\n")
    state = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.zeros([], jnp.int32)}
    imported.write(str(tmp_path), definition, ["ModelConfig.d_model = 48", "DataConfig.tokenizer = 'byte'"], state,
                   {"position": 0})
    assert sorted(os.listdir(tmp_path)) == sorted([rundir.RUN_JSON, rundir.PLAN_JSON, rundir.CONFIG_GIN,
                                                   rundir.MODEL_GIN, rundir.CHECKPOINTS])
    assert json.loads((tmp_path / rundir.RUN_JSON).read_text()) == definition.identity.record
    assert (tmp_path / rundir.CONFIG_GIN).read_text() == "# the operative gin\n"
    assert (tmp_path / rundir.MODEL_GIN).read_text().splitlines()[1:] == [
        "ModelConfig.d_model = 48", "DataConfig.tokenizer = 'byte'"]
    directory = str(tmp_path / rundir.CHECKPOINTS)
    assert checkpoint.checkpoint_steps(directory) == [0]
    restored, data_state = checkpoint.read_checkpoint(directory, 0, state)
    np.testing.assert_array_equal(restored["w"], state["w"])
    assert data_state == {"position": 0}
