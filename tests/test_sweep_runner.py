import dataclasses
import json
import math
import os
import types

import numpy as np
import pytest

from celerity_jax import recipe, rundir
from celerity_jax.errors import ConfigError
from celerity_jax.sweep import report, runner, spec

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



def _sweep_loss(plan, step_T):
    return _synthetic_loss(plan.n_params, plan.tau, step_T / plan.steps, step_T)


def _spec(tmp_path, **overrides) -> spec.SweepSpec:
    param, settings = spec.parse_sweep("RecipeConfig.tau=" + ",".join(TAUS))
    fields = dict(workdir=str(tmp_path / "sweep"), model=os.path.join(TINY, "d80.gin"), param=param,
                  settings=settings, gin_files=(SMOKE,), gin_params=("RecipeConfig.tpp = 4",),
                  reference_models=(os.path.join(TINY, "d48.gin"), os.path.join(TINY, "d64.gin")))
    fields.update(overrides)
    return spec.SweepSpec(**fields)


def test_full_sweep_predicts_the_true_ranking_with_no_regret(tmp_path, fake_trainer):
    trainer, logged = fake_trainer(_sweep_loss), []
    summary = runner.run_sweep(_spec(tmp_path), train_fn=trainer, log=logged.append)
    assert len(trainer.calls) == 9 and all(c["stop_at_step"] == 0 and not c["force_new"] for c in trainer.calls)
    steps = summary["settings"][0]["steps"]
    assert f"\n== tau_0.1/d80: steps 0 -> {steps} of {steps}" in logged
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
        assert row["auto"]["ranking"] == row["nearest"]["ranking"]
    for s in summary["settings"]:
        assert s["method"] == "auto" and s["status"] == "finished" and set(s["predictions"]) == {"auto", "family",
                                                                                                 "nearest"}
        for f in map(str, summary["fractions"]):  # two reference sizes: leave-one-size-out scores nearest alone
            assert s["method_choice"][f]["method"] == "nearest" and set(s["method_choice"][f]["scores"]) == {"nearest"}
            assert "leave-one-size-out can score no other method" in s["method_choice"][f]["reason"]
            assert s["predictions"]["auto"][f] == s["predictions"]["nearest"][f]
        # d48 is shorter than the short-run regime (915 steps, 468,288 tokens), d64 is not
        (short,) = [n for n in s["notes"] if "shorter than the regime" in n]
        assert short.startswith(f"reference {tmp_path / 'sweep' / s['name'] / 'd48.reference.json'} (")
    workdir = tmp_path / "sweep"
    assert json.loads((workdir / "sweep.json").read_text())["format"] == report.FORMAT
    markdown = (workdir / "sweep.md").read_text()
    assert "True ranking (smoothed final training loss): tau_0.3 <" in markdown
    assert "| auto (nearest) |" in markdown and " (nearest) |" in markdown
    assert "- @0.1, every setting: nearest: with 2 sizes leave-one-size-out can score no other method" in markdown
    differing = json.loads(json.dumps(summary))  # choices that differ by setting are listed per setting
    differing["settings"][0]["method_choice"]["0.1"]["reason"] = "family: as asked"
    lines = report.render_markdown(differing).splitlines()
    assert "- @0.1, tau_0.1: family: as asked" in lines and sum(x.startswith("- @0.1, ") for x in lines) == 3
    assert (workdir / "tau_0.1" / "d48.reference.json").exists() and (workdir / "tau_0.1" / "d80" / "curve.csv").exists()
    # Training times are each run's own (timing.json in its run directory).
    labels = [f"tau_{v}/{size}" for v in TAUS for size in ("d48", "d64")] + [f"tau_{v}/d80" for v in TAUS]
    assert sorted(summary["seconds"]) == sorted(labels)
    for label in labels:
        with open(workdir / label / rundir.TIMING_JSON) as f:
            assert summary["seconds"][label] == json.load(f)["train_seconds"] > 0
    assert [s["seconds"] for s in summary["settings"]] == [summary["seconds"][f"tau_{v}/d80"] for v in TAUS]
    assert summary["reference_seconds"] == pytest.approx(sum(summary["seconds"][x] for x in labels[:6]))
    # A rerun trains nothing.
    again = runner.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == 9 and again["seconds"] == summary["seconds"]

    # A named method ranks by its own entry; one the references have too few sizes for falls back to nearest.
    sr = runner.plan_sweep(_spec(tmp_path))[0]
    ref_paths = runner.reference_paths(sr, False)
    family = runner.setting_predictions(sr, ref_paths, _spec(tmp_path, method="family"))
    assert family["method"] == "family" and "auto" not in family
    assert family["method_choice"]["0.1"] == {"method": "family", "scores": {}, "reason": "family: as asked"}
    shrunk = runner.setting_predictions(sr, ref_paths, _spec(tmp_path, method="shrunk"))
    assert shrunk["method"] == "nearest" and "shrunk" not in shrunk
    assert "shrunk was asked for, but it needs references of 3 sizes" in shrunk["method_choice"]["0.1"]["reason"]


def _drift_at_low_tau_loss(plan, step_T):
    """At τ 0.1 the curve's shape drifts with log N (the family-aware curve predicts it); at the others it zigzags
    with N (d48 up, d64 down, d80 up), which the nearest size predicts better."""
    frac = step_T / plan.steps
    log_n = math.log2(plan.n_params / 1e5)
    drift = 0.1 * log_n if plan.tau == 0.1 else 0.05 * math.cos(math.pi * round(log_n))
    return 2.0 * (plan.n_params / 1e5) ** -0.1 * (1.0 + (0.5 + drift) * (1.0 - frac) ** 1.5)


def test_auto_ranks_every_setting_by_one_method_chosen_on_all_their_references(tmp_path, fake_trainer):
    sizes = tuple(os.path.join(TINY, f"{d}.gin") for d in ("d48", "d64", "d80"))
    sweep = _spec(tmp_path, model=os.path.join(TINY, "d96.gin"), reference_models=sizes)
    summary = runner.run_sweep(sweep, train_fn=fake_trainer(_drift_at_low_tau_loss), log=lambda _: None)
    setting_runs = runner.plan_sweep(sweep)
    alone = {sr.setting.name: runner.setting_predictions(sr, runner.reference_paths(sr, False), sweep)
             for sr in setting_runs}
    for f in map(str, sweep.fractions):
        # each setting's references alone disagree on the method...
        assert len({alone[name]["method_choice"][f]["method"] for name in alone}) == 2
        # ...the sweep ranks them all by one, chosen on every setting's references
        chosen = {s["method_choice"][f]["method"] for s in summary["settings"]}
        assert len(chosen) == 1 and "(3 sizes, 3 families)" in summary["settings"][0]["method_choice"][f]["reason"]
        method = chosen.pop()
        assert all(s["predictions"]["auto"][f] == s["predictions"][method][f] for s in summary["settings"])


def _crossing_loss(plan, step_T):
    """The best τ (BEST_TAU, 3% lower final loss) falls more slowly at first: its curve crosses the others."""
    best = plan.tau == BEST_TAU
    final = 2.0 * (plan.n_params / 1e5) ** -0.1 * (1.0 if best else 1.03)
    return final * (1.0 + (0.8 if best else 0.4) * (1.0 - step_T / plan.steps) ** 1.5)


def test_current_best_picks_by_the_loss_so_far_and_misses_a_late_winner(tmp_path, fake_trainer):
    summary = runner.run_sweep(_spec(tmp_path), train_fn=fake_trainer(_crossing_loss), log=lambda _: None)
    best_final = min(s["final_loss"] for s in summary["settings"])
    for row in summary["per_fraction"]:
        assert row["auto"]["chosen"] == ["tau_0.3"] and row["auto"]["regret"] == 0.0
        current = row[report.CURRENT_BEST]
        assert current["chosen"] == [current["ranking"][0]] != ["tau_0.3"]
        assert current["regret"] == pytest.approx(0.03 * best_final, rel=0.1)  # finals are smoothed
        assert current["target_compute_fraction"] == row["auto"]["target_compute_fraction"]
        for s in summary["settings"]:
            plan = types.SimpleNamespace(tau=s["tau"], n_params=s["n_params"], steps=s["steps"])
            expected = float(_crossing_loss(plan, np.array(row["fraction"] * s["steps"])))
            # smoothed over the past bins of its window, on a falling curve: a little above the loss at f
            assert expected < s["loss_so_far"][str(row["fraction"])] < 1.02 * expected
    assert "| current best (lowest loss so far) |" in (tmp_path / "sweep" / "sweep.md").read_text()


def test_stop_at_trains_only_the_predicted_best_and_a_rerun_finishes_the_rest(tmp_path, fake_trainer):
    trainer = fake_trainer(_sweep_loss)
    summary = runner.run_sweep(_spec(tmp_path, stop_at=0.2, keep=1), train_fn=trainer, log=lambda _: None)
    status = {s["name"]: (s["status"], s["steps_done"], s["steps"]) for s in summary["settings"]}
    assert status["tau_0.3"][0] == "finished"
    for name in ("tau_0.1", "tau_0.9"):
        state, done, steps = status[name]
        assert state == "stopped" and done == math.floor(0.2 * steps)
    assert sorted(summary["stopped"]) == ["tau_0.1", "tau_0.9"] and summary["true_ranking"] is None
    # The stopped settings have no loss at t̂ = 0.3, so there is no current-best decision there.
    assert [s["loss_so_far"]["0.3"] is None for s in summary["settings"]] == [True, False, True]
    assert [report.CURRENT_BEST in row for row in summary["per_fraction"]] == [True, True, False]
    assert "Stopped at t̂ = 0.2" in (tmp_path / "sweep" / "sweep.md").read_text()
    calls = len(trainer.calls)
    summary = runner.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == calls + 2 and summary["true_ranking"][0] == "tau_0.3"


def test_references_that_do_not_share_the_controls_are_refused_before_training(tmp_path, fake_trainer):
    trainer = fake_trainer(_sweep_loss)
    # Sweeping λ directly: the sizes' τ differ (η and the batch differ), so no reference matches.
    param, settings = spec.parse_sweep("RecipeConfig.weight_decay=0.5,1.0")
    with pytest.raises(ConfigError, match="RecipeConfig.tau rather than weight_decay"):
        runner.run_sweep(_spec(tmp_path, param=param, settings=settings,
                              gin_params=("RecipeConfig.tpp = 4", "RecipeConfig.tau = None")),
                        train_fn=trainer, log=lambda _: None)
    # τ is a control: references shared across τ settings cannot serve all of them.
    with pytest.raises(ConfigError, match="tau"):
        runner.run_sweep(_spec(tmp_path, shared_references=True,
                              gin_params=("RecipeConfig.tpp = 4", "RecipeConfig.tau = 0.3")),
                        train_fn=trainer, log=lambda _: None)
    assert trainer.calls == [] and not os.path.exists(tmp_path / "sweep")


def test_batch_sweep_at_fixed_tau_shares_references(tmp_path, fake_trainer):
    trainer = fake_trainer(_sweep_loss)
    param, settings = spec.parse_sweep("RecipeConfig.batch_seqs=8,16")
    summary = runner.run_sweep(_spec(tmp_path, param=param, settings=settings, shared_references=True,
                                    gin_params=("RecipeConfig.tpp = 4", "RecipeConfig.tau = 0.3")),
                              train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == 4  # two shared references, two targets
    assert (tmp_path / "sweep" / "shared" / "d64.reference.json").exists()
    assert {s["batch_seqs"] for s in summary["settings"]} == {8, 16}
    assert all(abs(e) < 0.005 for row in summary["per_fraction"] for e in row["family"]["errors"].values())


def test_given_references_per_setting(tmp_path, fake_trainer):
    trainer = fake_trainer(_sweep_loss)
    runner.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    first = tmp_path / "sweep"
    refs = tuple((v, (str(first / f"tau_{v}" / "d48"), str(first / f"tau_{v}" / "d64.reference.json"))) for v in TAUS)
    summary = runner.run_sweep(_spec(tmp_path, workdir=str(tmp_path / "again"), reference_models=(),
                                    references_for=refs), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == 9 + 3 and summary["per_fraction"][0]["family"]["chosen"] == ["tau_0.3"]
    assert (tmp_path / "again" / "tau_0.1" / "given-0.reference.json").exists()
    swapped = ((TAUS[0], refs[1][1]),) + refs[1:]
    with pytest.raises(ConfigError, match="tau"):
        runner.run_sweep(_spec(tmp_path, workdir=str(tmp_path / "third"), reference_models=(),
                              references_for=swapped), train_fn=trainer, log=lambda _: None)
    with pytest.raises(ConfigError, match="no references for the setting"):
        runner.run_sweep(_spec(tmp_path, workdir=str(tmp_path / "third"), reference_models=(),
                              references_for=refs[:2]), train_fn=trainer, log=lambda _: None)


def test_a_workdir_holding_another_run_is_refused(tmp_path, fake_trainer):
    trainer = fake_trainer(_sweep_loss)
    runner.run_sweep(_spec(tmp_path), train_fn=trainer, log=lambda _: None)
    changed = _spec(tmp_path, gin_params=("RecipeConfig.tpp = 5",))
    with pytest.raises(ConfigError, match="holds a different run"):
        runner.run_sweep(changed, train_fn=trainer, log=lambda _: None)
    calls = len(trainer.calls)
    runner.run_sweep(dataclasses.replace(changed, force_new=True), train_fn=trainer, log=lambda _: None)
    assert len(trainer.calls) == calls + 9 and all(c["force_new"] for c in trainer.calls[calls:])


@pytest.mark.slow  # 17 s
def test_cli_sweep_stops_and_resumes_a_real_run(tmp_path, capsys):
    """One setting against a given reference curve: the target trains to --stop-at, is predicted, then
    resumes from its checkpoint to the end; a rerun trains nothing."""
    from celerity_jax import cli, gin_config

    configs = gin_config.parse_gin([os.path.join(TINY, "d48.gin"), SMOKE],
                                   ["RecipeConfig.tpp = 0.25", "RecipeConfig.tau = 0.9"])
    ref_plan = recipe.make_plan(configs.model, configs.recipe)
    step = np.arange(1, 201)
    with open(tmp_path / "ref.csv", "w") as f:
        f.write("step,loss\n" + "".join(f"{s},{float(v)!r}\n" for s, v in
                                        zip(step, _synthetic_loss(ref_plan.n_params, 0.9, step / 200, step))))
    with open(tmp_path / "ref.json", "w") as f:
        json.dump({"n_params": ref_plan.n_params, "tpp": 0.25, "tau": 0.9, "schedule": "d2z", "total_steps": 200}, f)
    workdir = tmp_path / "sweep"
    argv = ["sweep", "--model", os.path.join(TINY, "d64.gin"), "--gin-file", SMOKE, "--gin-param",
            "RecipeConfig.tpp = 0.25", "--sweep", "RecipeConfig.tau=0.9", "--reference", str(tmp_path / "ref.csv"),
            "--fractions", "0.3", "--stop-at", "0.5", "--workdir", str(workdir)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads((workdir / "sweep.json").read_text())
    (setting,) = summary["settings"]
    steps = setting["steps"]
    assert f"steps 0 -> {steps // 2} of {steps}" in out and f"steps {steps // 2} -> {steps} of {steps}" in out
    assert setting["status"] == "finished" and setting["method"] == "auto"
    assert setting["method_choice"]["0.3"]["reason"].startswith("nearest: the references have one size")
    assert [float(f) for f in setting["predictions"]["nearest"]] == [0.3, 0.5]
    assert all(math.isfinite(p["pred"]) and p["pred"] > 0 for p in setting["predictions"]["nearest"].values())
    curve = np.loadtxt(workdir / "tau_0.9" / "d64" / "curve.csv", delimiter=",", skiprows=1)
    assert list(curve[:, 0]) == list(range(1, setting["steps"] + 1))  # stopped, resumed, no step twice
    assert (workdir / "tau_0.9" / "given-0.reference.json").exists()
    assert cli.main(argv) == 0 and "steps 0 -> " not in capsys.readouterr().out


@pytest.mark.slow
def test_cli_sweep_trains_references_and_stops_the_loser(tmp_path, capsys):
    """Two settings, one trained reference size, real training (about half a minute)."""
    from celerity_jax import cli

    workdir = tmp_path / "sweep"
    code = cli.main(["sweep", "--model", os.path.join(TINY, "d64.gin"),
                     "--reference-model", os.path.join(TINY, "d48.gin"), "--gin-file", SMOKE,
                     "--gin-param", "RecipeConfig.tpp = 0.25", "--sweep", "RecipeConfig.tau=0.3,0.9",
                     "--fractions", "0.3,0.5", "--stop-at", "0.5", "--keep", "1", "--workdir", str(workdir)])
    out = capsys.readouterr().out
    assert code == 0 and "wrote" in out
    summary = json.loads((workdir / "sweep.json").read_text())
    assert [s["method"] for s in summary["settings"]] == ["auto", "auto"]
    assert [s["method_choice"]["0.5"]["method"] for s in summary["settings"]] == ["nearest", "nearest"]
    assert sorted(s["status"] for s in summary["settings"]) == ["finished", "stopped"]
    row = summary["per_fraction"][1]
    assert row["fraction"] == 0.5 and len(row["nearest"]["ranking"]) == 2
    assert all(math.isfinite(p["pred"]) and p["pred"] > 0
               for s in summary["settings"] for p in s["predictions"]["nearest"].values())
