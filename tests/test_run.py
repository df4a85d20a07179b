"""`celerity_jax.run`: loading a run by its gin files, bindings and workdir, and training it to a step."""

import os

import pytest

from celerity_jax import run, rundir
from celerity_jax.errors import ConfigError

STOP_AT_5 = "TrainConfig.stop_at_step = 5"


def _quiet(_):
    pass


def test_train_to_trains_saves_the_operative_config_and_then_has_nothing_to_do(tmp_path, tiny_gin, curve_losses):
    the_run = run.load(run.RunSpec(str(tmp_path / "run"), tiny_gin, (STOP_AT_5,)))
    assert the_run.last_step == 5 and the_run.steps_done() == 0
    summary = the_run.train_to(3, log=_quiet)
    assert summary["final_step"] == 3 and summary["stopped"] == "stop_at_step"
    summary = the_run.train_to(log=_quiet)
    assert summary["start_step"] == 3 and summary["final_step"] == 5 and summary["stopped"] == "stop_at_step"
    assert the_run.steps_done() == 5 and sorted(curve_losses(the_run.workdir)) == [1, 2, 3, 4, 5]
    assert the_run.train_to(log=_quiet) is None
    assert the_run.train_seconds() > 0
    operative = (tmp_path / "run" / "config.gin").read_text()
    assert STOP_AT_5 in operative and "ModelConfig.d_model = 48" in operative


def test_force_new_archives_only_a_different_run(tmp_path, tiny_gin):
    workdir = str(tmp_path / "run")
    d64 = ("ModelConfig.d_model = 64", "ModelConfig.n_heads = 4", STOP_AT_5)
    run.load(run.RunSpec(workdir, tiny_gin, ("TrainConfig.stop_at_step = 3",))).train_to(log=_quiet)
    resumed = run.load(run.RunSpec(workdir, tiny_gin, (STOP_AT_5,))).train_to(force_new=True, log=_quiet)
    assert resumed["start_step"] == 3  # the same run: resumed, not archived
    assert not [n for n in os.listdir(workdir) if n.startswith("archived-")]
    other = run.load(run.RunSpec(workdir, tiny_gin, d64))
    with pytest.raises(ConfigError, match="different run"):
        other.train_to(log=_quiet)
    assert other.train_to(force_new=True, log=_quiet)["start_step"] == 0
    assert len([n for n in os.listdir(workdir) if n.startswith("archived-")]) == 1


# With a fake trainer (as the sweep's tests inject one): what train_to asks of the trainer, and when.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE_D48 = (os.path.join(ROOT, "experiments", "tiny", "d48.gin"), os.path.join(ROOT, "tests", "configs", "smoke.gin"))


def test_a_named_run_announces_each_stretch_it_trains_and_its_time_adds_up(tmp_path, fake_trainer):
    trainer, logged = fake_trainer(), []
    the_run = run.load(run.RunSpec(str(tmp_path / "r"), SMOKE_D48, ("RecipeConfig.tpp = 0.25",), name="d48"))
    steps = the_run.plan.steps
    assert the_run.last_step == steps and not the_run.finished() and the_run.train_seconds() == 0.0
    assert the_run.controls.n_params == the_run.plan.n_params

    half = steps // 2
    assert the_run.train_to(half, train_fn=trainer, log=logged.append)["final_step"] == half
    assert trainer.calls[-1]["stop_at_step"] == half and not trainer.calls[-1]["force_new"]
    assert "RecipeConfig.tpp = 0.25" in trainer.calls[-1]["operative_config"]
    assert logged == [f"\n== d48: steps 0 -> {half} of {steps}"]
    assert the_run.steps_done() == half and not the_run.finished()
    first = the_run.train_seconds()
    assert first > 0
    assert the_run.train_to(half, train_fn=trainer) is None and len(trainer.calls) == 1

    assert the_run.train_to(train_fn=trainer, log=logged.append)["stopped"] == "finished"
    assert trainer.calls[-1]["stop_at_step"] == 0  # to the end: the run's own configs
    assert logged[-1] == f"\n== d48: steps {half} -> {steps} of {steps}"
    assert the_run.finished() and the_run.train_seconds() > first
    assert the_run.train_to(train_fn=trainer) is None and len(trainer.calls) == 2


def test_an_unnamed_run_is_not_announced_and_never_trains_past_its_last_step(tmp_path, fake_trainer):
    trainer, logged = fake_trainer(), []
    the_run = run.load(run.RunSpec(str(tmp_path / "r"), SMOKE_D48, ("RecipeConfig.tpp = 0.25", STOP_AT_5)))
    the_run.train_to(10, train_fn=trainer, log=logged.append)
    assert logged == [] and the_run.name == str(tmp_path / "r")
    assert trainer.calls[-1]["stop_at_step"] == 5 and the_run.steps_done() == 5 and not the_run.finished()


def test_train_all_trains_each_run_to_its_end_and_logs_one_line_per_run(tmp_path, fake_trainer):
    trainer, logged = fake_trainer(), []
    specs = [run.RunSpec(str(tmp_path / name), SMOKE_D48, (f"RecipeConfig.tpp = {tpp}",), name=name)
             for name, tpp in (("a", 0.25), ("b", 0.5))]
    run.train_all(specs, log=logged.append, train_fn=trainer)
    steps = [run.load(spec).plan.steps for spec in specs]
    assert [run.load(spec).finished() for spec in specs] == [True, True] and len(trainer.calls) == 2
    assert [line.rsplit(",", 1)[0] for line in logged] == [
        f"{spec.name}: {n} steps, {run.load(spec).plan.tokens:,} tokens" for spec, n in zip(specs, steps)]
    run.train_all(specs, log=logged.append, train_fn=trainer)  # finished: nothing trains again
    assert len(trainer.calls) == 2 and len(logged) == 4


def test_steps_done_and_finished_refuse_a_workdir_holding_another_run(tmp_path, fake_trainer):
    trainer = fake_trainer()
    workdir = str(tmp_path / "r")
    run.load(run.RunSpec(workdir, SMOKE_D48, ("RecipeConfig.tpp = 0.25",))).train_to(train_fn=trainer)
    other = run.load(run.RunSpec(workdir, SMOKE_D48, ("RecipeConfig.tpp = 0.5",)))
    for check in (other.steps_done, other.finished):
        with pytest.raises(ConfigError, match="holds a different run"):
            check()
    other.train_to(train_fn=trainer, force_new=True)
    assert trainer.calls[-1]["force_new"] and other.finished()
    (archived,) = [d for d in os.listdir(workdir) if d.startswith("archived-")]
    assert os.path.isfile(os.path.join(workdir, archived, rundir.TIMING_JSON))  # the old run's time went with it
