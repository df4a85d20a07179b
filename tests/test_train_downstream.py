import json
import os

import pytest

from celerity_jax.cli import main
from celerity_jax.configs import RunDefinition, TrainConfig
from celerity_jax.errors import ConfigError
from celerity_jax.evaluate import results
from celerity_jax.train import loop
from celerity_jax.train.downstream import downstream_steps

SCORED = ("TrainConfig.downstream_tasks = ('stdlib_next_line',)", "TrainConfig.downstream_points = 2",
          "TrainConfig.downstream_limit = 20")


def test_the_run_is_scored_at_even_frac_as_celerity_eval_scores_its_checkpoint(tiny_configs, tmp_path):
    configs = tiny_configs(*SCORED)
    assert downstream_steps(configs.train, 114) == {57, 114}
    workdir = str(tmp_path / "run")
    loop.train(RunDefinition.of(configs), workdir, log=lambda _: None)
    assert sorted(os.listdir(os.path.join(workdir, "downstream"))) == ["step_114.json", "step_57.json"]
    with open(results.result_path(workdir, 114)) as f:
        in_loop = json.load(f)["tasks"]["stdlib_next_line"]
    os.remove(results.result_path(workdir, 114))
    assert main(["eval", "--workdir", workdir, "--tasks", "stdlib_next_line", "--limit", "20"]) == 0
    with open(results.result_path(workdir, 114)) as f:
        offline = json.load(f)["tasks"]["stdlib_next_line"]
    assert in_loop == offline and in_loop["docs"] == 20


def test_tasks_and_points_come_together():
    with pytest.raises(ConfigError, match="set both"):
        TrainConfig(downstream_tasks=("stdlib_next_line",))
    with pytest.raises(ConfigError, match="set both"):
        TrainConfig(downstream_points=3)


def test_an_unknown_task_stops_the_run_before_anything_is_written(tiny_run, tmp_path):
    run = tiny_run("TrainConfig.downstream_tasks = ('stdlib_next_lines',)", "TrainConfig.downstream_points = 2")
    with pytest.raises(ConfigError, match="unknown task 'stdlib_next_lines'; did you mean stdlib_next_line"):
        loop.train(run, str(tmp_path / "run"), log=lambda _: None)
    assert not os.path.exists(tmp_path / "run")
