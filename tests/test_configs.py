"""A run's configs: TrainConfig's checks and eval steps, RunConfigs' checks across configs, and RunDefinition."""

import dataclasses

import numpy as np
import pytest

from celerity_jax.configs import RunDefinition, TrainConfig
from celerity_jax.errors import ConfigError


@pytest.mark.parametrize("fields, problem", [
    (dict(mesh_shape=(-1, -1, 1)), r"mesh_shape=\(-1, -1, 1\): give 3 positive sizes .* at most one of them -1"),
    (dict(mesh_shape=(2, 0, 1)), r"mesh_shape=\(2, 0, 1\): give 3 positive sizes"),
    (dict(microbatches=0), r"TrainConfig.microbatches=0 must be >= 1"),
    (dict(downstream_tasks=("hellaswag",)), r"downstream_tasks=\('hellaswag',\) and downstream_points=0: set both"),
    (dict(loss_ema=1.0), r"TrainConfig.loss_ema=1.0 must be in \[0, 1\)"),
])
def test_a_bad_train_config_is_one_line_naming_the_field(fields, problem):
    with pytest.raises(ConfigError, match=problem):
        TrainConfig(**fields)


def test_eval_points_spread_evals_over_the_same_fractions_for_every_length():
    assert TrainConfig(eval_points=4, eval_every=0).eval_steps(100) == {12, 38, 62, 88, 100}
    assert TrainConfig(eval_points=4, eval_every=0).eval_steps(1143) == {143, 429, 714, 1000, 1143}
    for steps in (1143, 1924, 2905):  # the same number of evals in each of 25 bins, whatever the run's length
        frac = np.array(sorted(TrainConfig(eval_points=50).eval_steps(steps))) / steps
        assert np.bincount(np.minimum(frac * 25, 24).astype(int), minlength=25).tolist() == [2] * 24 + [3]
    assert TrainConfig(eval_points=0, eval_every=100).eval_steps(1143) == {1143}  # the last step too
    assert TrainConfig(eval_points=0, eval_every=0).eval_steps(1143) == frozenset()
    assert TrainConfig(eval_points=4, eval_every=500).all_eval_steps(1143) == {143, 429, 500, 714, 1000, 1143}
    assert TrainConfig(eval_points=0, eval_every=0).all_eval_steps(1143) == frozenset()
    with pytest.raises(ConfigError, match="TrainConfig.eval_points=-1 must be >= 0"):
        TrainConfig(eval_points=-1)


@pytest.mark.parametrize("bindings, match", [
    (("TrainConfig.eval_every = 0",), "never evaluates"),
    (("TrainConfig.eval_every = 0", "TrainConfig.eval_points = 20"), "n_bins=50 exceeds"),
])
def test_a_monitor_on_the_eval_curve_needs_an_eval_in_every_bin(tiny_configs, bindings, match):
    with pytest.raises(ConfigError, match=match):
        tiny_configs(*bindings, "MonitorConfig.loss_curve = 'eval'")


def test_a_definition_stopping_early_keeps_its_plan_and_identity(tiny_run):
    definition = tiny_run()
    assert definition.last_step == definition.plan.steps
    early = definition.stopping_at(10)
    assert early.last_step == 10 and early.configs.train.stop_at_step == 10
    assert (early.plan, early.identity) == (definition.plan, definition.identity)
    assert dataclasses.replace(definition.configs.train, stop_at_step=10) == early.configs.train
    assert RunDefinition.of(early.configs).identity == definition.identity
