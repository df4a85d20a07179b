"""TrainConfig.init_from: a new run directory started from another run's checkpoint (tiny d48, few steps)."""

import json
import os

import jax
import numpy as np
import pytest

from celerity_jax import optim, recipe
from celerity_jax.errors import ConfigError
from celerity_jax.model import completep, transformer
from celerity_jax.rundir import checkpoint
from celerity_jax.train import loop, step as step_lib


def _state_at(workdir, step, configs):
    """The train state saved at `step` in `workdir`."""
    rng = jax.random.key(0)
    plan = recipe.make_plan(configs.model, configs.recipe)
    optimizer = optim.build_optimizer(plan, completep.multipliers(configs.model, transformer.declarations(configs.model)))
    like = jax.eval_shape(lambda: step_lib.init_state(configs.model, optimizer, configs.monitor, rng))
    return checkpoint.read_checkpoint(os.path.join(workdir, "checkpoints"), step, like)[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_run):
    """A run stopped at step 10 (a checkpoint there), then continued in place to step 20."""
    workdir = str(tmp_path_factory.mktemp("init") / "source")
    loop.train(tiny_run("TrainConfig.stop_at_step = 10"), workdir, log=lambda _: None)
    loop.train(tiny_run("TrainConfig.stop_at_step = 20"), workdir, log=lambda _: None)
    return workdir


def _listing(directory):
    return sorted((os.path.relpath(d, directory), sorted(f)) for d, _, f in os.walk(directory))


def test_a_restart_into_a_new_directory_reproduces_the_source_exactly(source, tmp_path, tiny_configs, curve_losses,
                                                                      tiny_run):
    src = source
    workdir = str(tmp_path / "restart")
    before = _listing(src)
    messages = []
    summary = loop.train(tiny_run("TrainConfig.stop_at_step = 20",
                                  f"TrainConfig.init_from = '{src}/checkpoints/10'"), workdir, log=messages.append)
    assert summary["start_step"] == 10 and summary["final_step"] == 20
    assert any("INIT_FROM: this run starts at step 10" in m and "config equals the source's" in m for m in messages)
    assert _listing(src) == before  # the source is only read
    assert curve_losses(workdir) == curve_losses(src)  # rows 1-10 copied from the source, 11-20 trained here
    with open(os.path.join(workdir, "init_from.json")) as f:
        record = json.load(f)
    assert record["step"] == 10 and record["differences"] == []
    configs = tiny_configs()
    restarted, original = _state_at(workdir, 20, configs), _state_at(src, 20, configs)
    for a, b in zip(jax.tree.leaves(restarted), jax.tree.leaves(original)):  # params, moments, monitor curve
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_new_weight_decay_applies_from_the_restart_and_is_logged(source, tmp_path, tiny_configs, curve_losses,
                                                                   tiny_run):
    src = source
    configs = tiny_configs()
    planned = recipe.make_plan(configs.model, configs.recipe).weight_decay
    wrong = 10 * planned
    workdir = str(tmp_path / "wrong_wd")
    messages = []
    loop.train(tiny_run("TrainConfig.stop_at_step = 20", f"TrainConfig.init_from = '{src}/checkpoints/10'",
                        f"RecipeConfig.weight_decay = {wrong!r}"), workdir, log=messages.append)
    text = "\n".join(messages)
    assert "recipe.weight_decay: None -> " in text and "plan.tau:" in text
    state = _state_at(workdir, 20, tiny_configs(f"RecipeConfig.weight_decay = {wrong!r}"))
    assert float(state.opt_state.hyperparams["weight_decay"]) == pytest.approx(wrong)  # not the checkpoint's λ
    assert int(state.step) == 20
    got, clean = curve_losses(workdir), curve_losses(src)
    assert all(got[s] == clean[s] for s in range(1, 12))  # step 11's loss precedes the first new update
    assert any(got[s] != clean[s] for s in range(12, 21))
    # The run resumes its own checkpoints from now on; init_from is not applied again.
    messages.clear()
    loop.train(tiny_run("TrainConfig.stop_at_step = 25", f"TrainConfig.init_from = '{src}/checkpoints/10'",
                        f"RecipeConfig.weight_decay = {wrong!r}"), workdir, log=messages.append)
    assert any("holds checkpoints of its own" in m for m in messages)
    assert any("resumed from the checkpoint at step 20" in m for m in messages)


def test_a_run_directory_as_source_means_its_newest_checkpoint(source, tmp_path, tiny_run):
    src = source
    summary = loop.train(tiny_run("TrainConfig.stop_at_step = 22", f"TrainConfig.init_from = '{src}'"),
                         str(tmp_path / "run"), log=lambda _: None)
    assert summary["start_step"] == 20 and summary["init_from"].endswith(os.path.join("checkpoints", "20"))


def _d64_with_the_same_steps(tiny_configs) -> tuple[str, ...]:
    tokens = recipe.make_plan(tiny_configs().model, tiny_configs().recipe).tokens
    d64 = ("ModelConfig.d_model = 64", "ModelConfig.n_heads = 4")
    return d64 + (f"RecipeConfig.tpp = {tokens / recipe.params.count_params(tiny_configs(*d64).model)!r}",)


@pytest.mark.parametrize("params, match", [
    (("RecipeConfig.tpp = 0.6",), "steps"),
    ("d64 with the same steps", "shapes"),
    (("MonitorConfig.n_bins = 40",), "n_bins"),
    (("MonitorConfig.loss_curve = 'eval'",), "loss_curve"),
    (("TrainConfig.seed = 3",), "data position"),
])
def test_an_incompatible_source_is_refused_before_anything_is_written(source, tmp_path, params, match, tiny_configs,
                                                                      tiny_run):
    src = source
    workdir = tmp_path / "run"
    if params == "d64 with the same steps":
        params = _d64_with_the_same_steps(tiny_configs)
    with pytest.raises(ConfigError, match=match):
        loop.train(tiny_run(*params, f"TrainConfig.init_from = '{src}/checkpoints/10'"), str(workdir),
                   log=lambda _: None)
    assert not workdir.exists()


def test_a_path_without_a_checkpoint_is_refused(tmp_path, tiny_run):
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    for path in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(ConfigError, match="init_from"):
            loop.train(tiny_run(f"TrainConfig.init_from = '{path}'"), str(tmp_path / "run"), log=lambda _: None)
    assert not (tmp_path / "run").exists()
