import json
import os
import shutil

import jax
import numpy as np
import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.evaluate import loader
from celerity_jax.rundir import checkpoint


def test_the_parameters_are_the_checkpoints_without_the_optimizer_state(trained_run):
    model = loader.load_model(trained_run)
    assert model.step == 114 and model.cfg.d_model == 48 and model.tokenizer.vocab_size == 257
    state, _ = checkpoint.read_checkpoint(os.path.join(trained_run, "checkpoints"), 114,
                                          _like_state(trained_run))
    flat = jax.tree_util.tree_leaves_with_path(model.params)
    assert len(flat) == len(jax.tree_util.tree_leaves(state.params))
    for (path, leaf), expected in zip(flat, jax.tree_util.tree_leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(expected), err_msg=jax.tree_util.keystr(path))
    assert loader.load_model(trained_run, step=100).step == 100


def _like_state(workdir):
    from celerity_jax import gin_config, recipe
    from celerity_jax.train import step as step_lib

    configs = gin_config.parse_gin([os.path.join(workdir, "config.gin")])
    plan = recipe.make_plan(configs.model, configs.recipe)
    build = step_lib.build_step(configs.model, plan, configs.monitor, loader.run_mesh(workdir), microbatches=1,
                                z_loss=0.0, seed=0)
    return build.init()


def test_a_checkpoint_that_fails_its_checksums_is_refused(trained_run, tmp_path):
    copy = str(tmp_path / "run")
    shutil.copytree(trained_run, copy)
    record_path = os.path.join(copy, "checkpoints", "114", "integrity", "metadata")
    with open(record_path) as f:
        record = json.load(f)
    key = next(k for k in record["state"] if k.startswith(".params['embed']"))
    record["state"][key] = "0" * 16
    with open(record_path, "w") as f:
        json.dump(record, f)
    with pytest.raises(ConfigError, match=r"the checkpoint at step 114 .* is corrupt: 1 array\(s\) do not match"):
        loader.load_model(copy)
    assert loader.load_model(copy, step=110).step == 110
