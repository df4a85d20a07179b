import dataclasses
import json
import math
import os

import numpy as np
import pytest

from celerity_jax import cli, recipe, sweep
from celerity_jax.errors import ConfigError
from celerity_jax.train.loop import run_identity

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "experiments", "tiny")
SMOKE = os.path.join(ROOT, "tests", "configs", "smoke.gin")
TAUS = ("0.1", "0.3", "0.9")
BEST_TAU = 0.3


def _synthetic_loss(n_params: float, tau: float, frac: np.ndarray, step: np.ndarray) -> np.ndarray:
    """A family that collapses within each τ (shape independent of N) but whose shape and final loss
    depend on τ; the best τ is BEST_TAU. Small deterministic noise."""
    final = 2.0 * (n_params / 1e5) ** -0.1 + 0.05 * math.log(tau / BEST_TAU) ** 2
    shape = 1.0 + (0.4 + 0.2 * tau) * (1.0 - frac) ** 1.5
    return final * shape * (1.0 + 0.002 * np.sin(7.0 * step))


class FakeTrainer:
    """Writes what the trainer writes (run.json, plan.json, curve.csv) from a synthetic loss, up to
    TrainConfig.stop_at_step, resuming where the curve ends."""

    def __init__(self):
        self.calls = []

    def __call__(self, configs, workdir, operative_config="", force_new=False):
        plan = recipe.make_plan(configs.model, configs.recipe)
        self.calls.append((workdir, configs.train.stop_at_step, force_new))
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "run.json"), "w") as f:
            json.dump(run_identity(configs, plan), f)
        with open(os.path.join(workdir, "plan.json"), "w") as f:
            f.write(plan.to_json())
        path = os.path.join(workdir, "curve.csv")
        start = 0
        if os.path.exists(path):
            start = int(open(path).read().strip().splitlines()[-1].split(",")[0])
        else:
            open(path, "w").write("step,tokens,frac,loss\n")
        end = min(plan.steps, configs.train.stop_at_step or plan.steps)
        step = np.arange(start + 1, end + 1)
        loss = _synthetic_loss(plan.n_params, plan.tau, step / plan.steps, step)
        with open(path, "a") as f:
            f.writelines(f"{s},{s * plan.batch_tokens},{float(s / plan.steps)!r},{float(v)!r}\n" for s, v in zip(step, loss))
        return {"final_step": end}


def _spec(tmp_path, **overrides) -> sweep.SweepSpec:
    param, settings = sweep.parse_sweep("RecipeConfig.tau=" + ",".join(TAUS))
    fields = dict(workdir=str(tmp_path / "sweep"), model=os.path.join(TINY, "d80.gin"), param=param,
                  settings=settings, gin_files=(SMOKE,), gin_params=("RecipeConfig.tpp = 4",),
                  reference_models=(os.path.join(TINY, "d48.gin"), os.path.join(TINY, "d64.gin")))
    fields.update(overrides)
    return sweep.SweepSpec(**fields)


def test_parse_sweep_names_settings_and_rejects_bad_input():
    param, settings = sweep.parse_sweep("RecipeConfig.tau=0.2, 0.4")
    assert param == "RecipeConfig.tau"
    assert [(s.name, s.binding) for s in settings] == [("tau_0.2", "RecipeConfig.tau = 0.2"),
                                                       ("tau_0.4", "RecipeConfig.tau = 0.4")]
    assert sweep.parse_sweep("RecipeConfig.schedule='d2z','wsd'")[1][1].name == "schedule_wsd"
    for bad in ("RecipeConfig.tau", "tau=0.2", "RecipeConfig.tau=", "RecipeConfig.tau=0.2,0.2"):
        with pytest.raises(ConfigError, match="--sweep"):
            sweep.parse_sweep(bad)
    assert sweep.parse_fractions("0.3,0.1") == (0.1, 0.3)
    with pytest.raises(ConfigError, match="fraction"):
        sweep.parse_fractions("0.1,1.0")


def test_full_sweep_predicts_the_true_ranking_with_no_regret(tmp_path):
    trainer = FakeTrainer()
    summary = sweep.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == 9 and all(stop == 0 and not force for _, stop, force in trainer.calls)
    assert summary["true_ranking"][0] == "tau_0.3"
    for row in summary["per_fraction"]:
        fam = row["family"]
        assert fam["chosen"] == ["tau_0.3"] and fam["regret"] == 0.0 and fam["kendall_tau"] == 1.0
        assert fam["mean_abs_error"] < 0.003
        # Every setting trains to the fraction, one of three (equal steps) to the end.
        assert fam["target_compute_fraction"] == pytest.approx((3 * row["fraction"] + 1 - row["fraction"]) / 3,
                                                               abs=0.01)
        assert fam["total_compute_fraction"] > fam["target_compute_fraction"]
        assert "nearest" in row
    assert all(s["method"] == "family" and s["status"] == "finished" for s in summary["settings"])
    workdir = tmp_path / "sweep"
    assert json.load(open(workdir / "sweep.json"))["format"] == sweep.FORMAT
    assert "True ranking (smoothed final training loss): tau_0.3 <" in (workdir / "sweep.md").read_text()
    assert (workdir / "tau_0.1" / "d48.reference.json").exists() and (workdir / "tau_0.1" / "d80" / "curve.csv").exists()
    # A rerun trains nothing.
    sweep.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == 9


def test_stop_at_trains_only_the_predicted_best_and_a_rerun_finishes_the_rest(tmp_path):
    trainer = FakeTrainer()
    summary = sweep.run_sweep(_spec(tmp_path, stop_at=0.2, keep=1), train_fn=trainer, log=lambda _: None)
    status = {s["name"]: (s["status"], s["steps_done"], s["steps"]) for s in summary["settings"]}
    assert status["tau_0.3"][0] == "finished"
    for name in ("tau_0.1", "tau_0.9"):
        state, done, steps = status[name]
        assert state == "stopped" and done == math.floor(0.2 * steps)
    assert sorted(summary["stopped"]) == ["tau_0.1", "tau_0.9"] and summary["true_ranking"] is None
    assert "Stopped at t̂ = 0.2" in (tmp_path / "sweep" / "sweep.md").read_text()
    calls = len(trainer.calls)
    summary = sweep.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == calls + 2 and summary["true_ranking"][0] == "tau_0.3"


def test_references_that_do_not_share_the_controls_are_refused_before_training(tmp_path):
    trainer = FakeTrainer()
    # Sweeping λ directly: the sizes' τ differ (η and the batch differ), so no reference matches.
    param, settings = sweep.parse_sweep("RecipeConfig.weight_decay=0.5,1.0")
    with pytest.raises(ConfigError, match="RecipeConfig.tau rather than weight_decay"):
        sweep.run_sweep(_spec(tmp_path, param=param, settings=settings,
                              gin_params=("RecipeConfig.tpp = 4", "RecipeConfig.tau = None")),
                        train_fn=trainer, log=lambda _: None)
    # τ is a control: references shared across τ settings cannot serve all of them.
    with pytest.raises(ConfigError, match="tau"):
        sweep.run_sweep(_spec(tmp_path, shared_references=True,
                              gin_params=("RecipeConfig.tpp = 4", "RecipeConfig.tau = 0.3")),
                        train_fn=trainer, log=lambda _: None)
    assert trainer.calls == [] and not os.path.exists(tmp_path / "sweep")


def test_batch_sweep_at_fixed_tau_shares_references(tmp_path):
    trainer = FakeTrainer()
    param, settings = sweep.parse_sweep("RecipeConfig.batch_seqs=8,16")
    summary = sweep.run_sweep(_spec(tmp_path, param=param, settings=settings, shared_references=True,
                                    gin_params=("RecipeConfig.tpp = 4", "RecipeConfig.tau = 0.3")),
                              train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == 4  # two shared references, two targets
    assert (tmp_path / "sweep" / "shared" / "d64.reference.json").exists()
    assert {s["batch_seqs"] for s in summary["settings"]} == {8, 16}
    assert all(abs(e) < 0.005 for row in summary["per_fraction"] for e in row["family"]["errors"].values())


def test_given_references_per_setting(tmp_path):
    trainer = FakeTrainer()
    sweep.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    first = tmp_path / "sweep"
    refs = tuple((v, (str(first / f"tau_{v}" / "d48"), str(first / f"tau_{v}" / "d64.reference.json"))) for v in TAUS)
    summary = sweep.run_sweep(_spec(tmp_path, workdir=str(tmp_path / "again"), reference_models=(),
                                    references_for=refs), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == 9 + 3 and summary["per_fraction"][0]["family"]["chosen"] == ["tau_0.3"]
    assert (tmp_path / "again" / "tau_0.1" / "given-0.reference.json").exists()
    swapped = ((TAUS[0], refs[1][1]),) + refs[1:]
    with pytest.raises(ConfigError, match="tau"):
        sweep.run_sweep(_spec(tmp_path, workdir=str(tmp_path / "third"), reference_models=(),
                              references_for=swapped), train_fn=trainer, log=lambda _: None)
    with pytest.raises(ConfigError, match="no references for the setting"):
        sweep.run_sweep(_spec(tmp_path, workdir=str(tmp_path / "third"), reference_models=(),
                              references_for=refs[:2]), train_fn=trainer, log=lambda _: None)


def test_a_workdir_holding_another_run_is_refused(tmp_path):
    trainer = FakeTrainer()
    sweep.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    changed = _spec(tmp_path, gin_params=("RecipeConfig.tpp = 5",))
    with pytest.raises(ConfigError, match="holds a different run"):
        sweep.run_sweep(changed, train_fn=trainer, log=lambda _: None)
    calls = len(trainer.calls)
    sweep.run_sweep(dataclasses.replace(changed, force_new=True), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == calls + 9 and all(force for _, _, force in trainer.calls[calls:])


def test_kendall_tau_and_decide():
    assert sweep.kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert sweep.kendall_tau(["a", "b", "c"], ["c", "b", "a"]) == -1.0
    preds = {"a": {"pred": 2.0, "err": 0.1}, "b": {"pred": 1.0, "err": 0.1}, "c": {"pred": 3.0, "err": 0.1}}
    assert sweep.decide(preds, 2) == ["b", "a"]
    assert sweep.decide({**preds, "d": None}, 1) is None


@pytest.mark.slow  # 17 s
def test_cli_sweep_stops_and_resumes_a_real_run(tmp_path, capsys):
    """One setting against a given reference curve: the target trains to --stop-at, is predicted, then
    resumes from its checkpoint to the end; a rerun trains nothing."""
    from celerity_jax import gin_config

    configs = gin_config.parse_gin([os.path.join(TINY, "d48.gin"), SMOKE],
                                   ["RecipeConfig.tpp = 0.25", "RecipeConfig.tau = 0.9"])
    ref_plan = recipe.make_plan(configs["model"], configs["recipe"])
    step = np.arange(1, 201)
    with open(tmp_path / "ref.csv", "w") as f:
        f.write("step,loss\n" + "".join(f"{s},{float(v)!r}\n" for s, v in
                                        zip(step, _synthetic_loss(ref_plan.n_params, 0.9, step / 200, step))))
    with open(tmp_path / "ref.json", "w") as f:
        json.dump({"n_params": ref_plan.n_params, "tpp": 0.25, "tau": 0.9, "schedule": "d2z", "total_steps": 200}, f)
    workdir = tmp_path / "sweep"
    argv = ["sweep", "--model", os.path.join(TINY, "d64.gin"), "--gin_file", SMOKE, "--gin_param",
            "RecipeConfig.tpp = 0.25", "--sweep", "RecipeConfig.tau=0.9", "--reference", str(tmp_path / "ref.csv"),
            "--fractions", "0.3", "--stop-at", "0.5", "--workdir", str(workdir)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    summary = json.load(open(workdir / "sweep.json"))
    (setting,) = summary["settings"]
    steps = setting["steps"]
    assert f"steps 0 -> {steps // 2} of {steps}" in out and f"steps {steps // 2} -> {steps} of {steps}" in out
    assert setting["status"] == "finished" and setting["method"] == "nearest"
    assert [float(f) for f in setting["predictions"]["nearest"]] == [0.3, 0.5]
    assert all(math.isfinite(p["pred"]) and p["pred"] > 0 for p in setting["predictions"]["nearest"].values())
    curve = np.loadtxt(workdir / "tau_0.9" / "d64" / "curve.csv", delimiter=",", skiprows=1)
    assert list(curve[:, 0]) == list(range(1, setting["steps"] + 1))  # stopped, resumed, no step twice
    assert (workdir / "tau_0.9" / "given-0.reference.json").exists()
    assert cli.main(argv) == 0 and "steps 0 -> " not in capsys.readouterr().out


@pytest.mark.slow
def test_cli_sweep_trains_references_and_stops_the_loser(tmp_path, capsys):
    """Two settings, one trained reference size, real training (about half a minute)."""
    workdir = tmp_path / "sweep"
    code = cli.main(["sweep", "--model", os.path.join(TINY, "d64.gin"),
                     "--reference-model", os.path.join(TINY, "d48.gin"), "--gin_file", SMOKE,
                     "--gin_param", "RecipeConfig.tpp = 0.25", "--sweep", "RecipeConfig.tau=0.3,0.9",
                     "--fractions", "0.3,0.5", "--stop-at", "0.5", "--keep", "1", "--workdir", str(workdir)])
    out = capsys.readouterr().out
    assert code == 0 and "wrote" in out
    summary = json.load(open(workdir / "sweep.json"))
    assert [s["method"] for s in summary["settings"]] == ["nearest", "nearest"]
    assert sorted(s["status"] for s in summary["settings"]) == ["finished", "stopped"]
    row = summary["per_fraction"][1]
    assert row["fraction"] == 0.5 and len(row["nearest"]["ranking"]) == 2
    assert all(math.isfinite(p["pred"]) and p["pred"] > 0
               for s in summary["settings"] for p in s["predictions"]["nearest"].values())
