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


def _run_with_config_gin(tmp_path, text):
    (tmp_path / "config.gin").write_text(text)
    return str(tmp_path)


def test_the_mesh_shape_is_read_from_config_gin_leaving_the_gin_configuration_alone(tmp_path, tiny_configs):
    import gin

    tiny_configs("TrainConfig.seed = 7")
    workdir = _run_with_config_gin(tmp_path, "# Parameters for TrainConfig:\nTrainConfig.log_every = 10\n"
                                             "TrainConfig.mesh_shape = (1, 1, 1)\n")
    assert loader.run_mesh(workdir).devices.shape == (1, 1, 1)
    assert gin.query_parameter("TrainConfig.seed") == 7
    workdir = _run_with_config_gin(tmp_path, "TrainConfig.mesh_shape = (2, 1, 1)\n")
    with pytest.raises(ConfigError, match=r"mesh_shape=\(2, 1, 1\) needs 2 devices"):
        loader.run_mesh(workdir)
    os.remove(os.path.join(workdir, "config.gin"))  # a run trained through the library: every device, data-parallel
    assert loader.run_mesh(workdir).devices.shape == (jax.device_count(), 1, 1)


@pytest.mark.parametrize("text, problem", [
    ("", "records no mesh shape"),
    ("TrainConfig.seed = 0\n", "records no mesh shape"),
    ("TrainConfig.mesh_shape = (1, 1\n", "cannot read the run's mesh shape"),
    ("TrainConfig.mesh_shape = (1, 1)\n", "records no mesh shape"),
])
def test_an_unreadable_mesh_shape_is_one_line_naming_the_fix(tmp_path, text, problem):
    workdir = _run_with_config_gin(tmp_path, text)
    with pytest.raises(ConfigError, match=problem) as refused:
        loader.run_mesh(workdir)
    assert "\n" not in str(refused.value) and ("celerity train" in str(refused.value)
                                               or "put back the config.gin" in str(refused.value))


def test_a_workdir_that_is_missing_or_a_file_is_named_as_such(tmp_path):
    (tmp_path / "a_file").write_text("")
    for name, problem in (("missing", "does not exist"), ("a_file", "is a file, not a folder")):
        with pytest.raises(ConfigError, match=f"--workdir {tmp_path / name} {problem}; give a run directory"):
            loader.load_model(str(tmp_path / name))
