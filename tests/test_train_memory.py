"""The per-chip memory of a compiled train step, and the trainer's refusal of a step that does not fit."""

import os

import pytest

from celerity_jax import recipe
from celerity_jax.aot.compile import StepSetting, apply_setting, slice_devices
from celerity_jax.errors import ConfigError
from celerity_jax.model.sharding import make_mesh
from celerity_jax.train import loop, memory, setup, step as step_lib
from celerity_jax.train.memory import compile_train_step


@pytest.mark.parametrize("message, gib", [
    ("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 49.34G of 32.00G hbm.", 49.34),
    ("RESOURCE_EXHAUSTED: the total memory required for HLO temporaries (1.66T) exceeds available HBM (95.74G).",
     1.66 * 1024),
    ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:", 0.0),
])
def test_out_of_memory_messages_give_the_bytes_xla_names(message, gib):
    assert memory._required_bytes(message) == pytest.approx(gib * 2**30)


def test_train_refuses_a_step_that_does_not_fit(tmp_path, tiny_configs, tpu_slice, too_big):
    configs = tiny_configs(*too_big)
    _, devices = slice_devices(tpu_slice)
    run = apply_setting(configs, StepSetting((4, 1, 1), 1, "none", True), "tpu")
    plan = recipe.make_plan(run.model, run.recipe)
    mesh = make_mesh((4, 1, 1), devices=devices)
    build = step_lib.build_step(run.model, plan, run.monitor, mesh, microbatches=1, z_loss=0.0, seed=0)
    with pytest.raises(ConfigError, match="does not fit.*TrainConfig.microbatches.*remat = 'dots'.*celerity compile"):
        compile_train_step(build, plan, run.train, run.model)


def test_train_refuses_before_writing_anything(tmp_path, monkeypatch, tiny_run):
    def refuse(*_):
        raise ConfigError("the train step does not fit")
    monkeypatch.setattr(setup, "compile_train_step", refuse)
    with pytest.raises(ConfigError, match="does not fit"):
        loop.train(tiny_run(), str(tmp_path / "run"), log=lambda _: None)
    assert not os.path.exists(tmp_path / "run")


def test_the_fix_names_the_next_remat_that_keeps_less():
    assert "remat = 'attention'" in memory.fix_hint(1, 8, 8, "dots")
    assert "remat = 'full'" in memory.fix_hint(1, 8, 8, "qkv")
    assert "remat" not in memory.fix_hint(1, 8, 8, "full")
