import json
import os

import numpy as np
import pytest

from celerity_jax import demo, demo_report
from celerity_jax.errors import ConfigError


def test_separation_and_delta_over_sigma_on_known_curves():
    rng = np.random.default_rng(0)
    keep_G = np.ones(200, bool)
    seeds_RxG = 1.0 + 0.01 * rng.standard_normal((40, 200))
    sigma_G = demo_report.seed_sigma([seeds_RxG])
    assert sigma_G.mean() == pytest.approx(0.01, rel=0.05)
    assert demo_report.separation(np.full(200, 1.05), np.ones(200), sigma_G, keep_G) == pytest.approx(5, rel=0.05)
    shifted = [seeds_RxG, seeds_RxG + 0.02]
    assert demo_report.delta_over_sigma(shifted, keep_G)["delta_over_sigma"] == pytest.approx(1.0, rel=0.1)
    with pytest.raises(ConfigError, match="second seed"):
        demo_report.seed_sigma([seeds_RxG[:1]])


def _fake_run(workdir, final, shape, n_params=84_760, tpp=10.0, noise=0.0, seed=0, plan_steps=2000):
    """A finished run directory whose eval curve is final·(1 + shape·(1 − t̂)²), with seeded noise; its plan says it
    took `plan_steps` steps of 1,024 tokens."""
    os.makedirs(workdir)
    steps = plan_steps
    step = np.arange(1, steps + 1)
    frac = step / steps
    loss = final * (1 + shape * (1 - frac) ** 2) * (1 + noise * np.random.default_rng(seed).standard_normal(steps))
    for name, rows in (("curve.csv", range(steps)), ("eval.csv", range(steps // 50 - 1, steps, steps // 50))):  # 50 evals
        with open(os.path.join(workdir, name), "w") as f:
            f.write("step,tokens,frac,loss\n")
            for i in rows:
                f.write(f"{step[i]},{step[i] * 64},{frac[i]},{loss[i]}\n")
    plan = {"n_params": n_params, "tpp": tpp, "tau": 0.25, "schedule": "d2z", "steps": plan_steps,
            "tokens": plan_steps * 1024, "warmup_steps": 40, "weight_decay": 0.5, "batch_seqs": 16, "base_lr": 0.012}
    with open(os.path.join(workdir, "plan.json"), "w") as f:
        json.dump(plan, f)


def _fake_demo(root, design, off_shape=0.6, naive_step=0.15, tau_drift=0.0, plan_steps=2000):
    """Panels where the off-τ and off-TPP curves differ in shape by `off_shape − 0.5`; a τ family whose shape steps
    by `tau_drift` per size and a naive one stepping by `naive_step`; every curve with 0.2% noise."""
    runs = demo.demo_runs(design)
    shapes = {"timescale/tau-div4": off_shape, "timescale/tau-x4": 1 - off_shape,
              "tpp/tpp-half": off_shape, "tpp/tpp-x2": 1 - off_shape}
    step = {"tau": tau_drift, "naive": naive_step}
    for i, r in enumerate(runs):
        k = design.sizes.index(r.label) if r.group in demo_report.RECIPES else 0
        shape = shapes.get(r.name.split("-seed")[0], 0.5 + step.get(r.group, 0) * k)
        _fake_run(root / r.name, 2.0 - 0.2 * k, shape, 84_760 * 3 ** k, noise=0.002, seed=i, plan_steps=plan_steps)
    return runs


def test_report_names_each_target_met_or_missed_and_keeps_its_keys(tmp_path):
    runs = _fake_demo(tmp_path, demo.DEFAULT)
    summary = demo_report.write_report(str(tmp_path), runs, {r.name: 1.0 for r in runs}, design="default",
                                       wall_seconds=12.0)
    assert summary["timescale"]["delta_over_sigma"] < 1.5 and min(summary["timescale"]["off"].values()) > 3
    assert summary["timescale"]["met"] and summary["tpp"]["met"] and summary["family"]["met"]
    assert summary["family"]["mae_ratio"] > 3 and summary["train_seconds"] == len(runs)
    assert abs(summary["family"]["naive"]["trend"]) > 10  # the naive family drifts; reported, not a target
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert set(on_disk) == {"quick", "design", "train_seconds", "wall_seconds", "regime", "timescale", "tpp", "family",
                            "runs"}
    assert on_disk["design"] == "default" and not on_disk["quick"] and on_disk["wall_seconds"] == 12.0
    assert set(on_disk["timescale"]) == {"equal", "delta", "sigma", "delta_over_sigma", "off", "met"}
    assert set(on_disk["tpp"]) == {"sigma", "pairs", "met"}
    assert set(on_disk["family"]) == {"tau", "naive", "mae_ratio", "met"}
    measures = {"sizes", "n_params", "trend_slope", "trend_se", "trend", "delta", "sigma", "delta_over_sigma", "floor",
                "mae_by_size", "mae", "seeds"}
    assert set(on_disk["family"]["tau"]) == measures | {"met"} and set(on_disk["family"]["naive"]) == measures
    assert on_disk["family"]["tau"]["sizes"] == list(demo.DEFAULT.sizes)
    assert on_disk["regime"]["outside"] == [] and on_disk["regime"]["min_steps"] > 0
    assert set(on_disk["runs"]["timescale/base"]) >= {"n_params", "tpp", "tau", "steps", "tokens", "final_eval_loss",
                                                     "seconds"}
    report = (tmp_path / "report.md").read_text()
    assert report.count(": met)") == 5 and "NOT met" not in report and "All of them do." in report
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_a_tau_family_that_drifts_steadily_misses_the_trend_target(tmp_path):
    runs = _fake_demo(tmp_path, demo.DEFAULT, tau_drift=0.01)
    family = demo_report.write_report(str(tmp_path), runs, {}, design="default")["family"]
    assert abs(family["tau"]["trend"]) > 2 and not family["met"]
    assert "target |trend| <= 2: NOT met" in (tmp_path / "report.md").read_text()


def test_a_quick_report_has_panels_1_and_2_and_names_runs_outside_the_regime(tmp_path):
    runs = _fake_demo(tmp_path, demo.QUICK, off_shape=0.5, plan_steps=400)
    summary = demo_report.write_report(str(tmp_path), runs, {}, design="quick")
    assert "family" not in summary and not summary["timescale"]["met"] and not summary["tpp"]["met"]
    assert summary["quick"] and summary["regime"]["outside"] == sorted(r.name for r in runs)
    report = (tmp_path / "report.md").read_text()
    assert "quick (panels 1 and 2)" in report and "target >= 3σ each: NOT met" in report
    assert "## 3." not in report and "**Outside it: timescale/base," in report


@pytest.mark.parametrize("accuracies, rising", [((0.30, 0.34, 0.41), True), ((0.30, 0.29, 0.28), False)])
def test_report_scores_the_family_downstream_and_says_whether_larger_sizes_score_higher(tmp_path, accuracies,
                                                                                        rising):
    from celerity_jax.evaluate import builtin_task, results

    runs = _fake_demo(tmp_path, demo.DEFAULT)
    downstream = {}
    for i, size in enumerate(demo.DEFAULT.sizes):
        plan = {"batch_tokens": 64, "steps": 400, "n_params": 100_000 * (i + 1), "flops_per_token": 6e5 * (i + 1)}
        score = {"metric": "acc", "value": accuracies[i], "stderr": 0.01, "docs": 1000, "shots": 0, "truncated": 0}
        downstream[f"tau/{size}"] = results.record(str(tmp_path / "tau" / size), 400, plan,
                                                   {builtin_task.TASK_NAME: score}, write_tensorboard=False)
    summary = demo_report.write_report(str(tmp_path), runs, {}, design="default", downstream=downstream)
    report = (tmp_path / "report.md").read_text()
    assert summary["downstream"]["rising"] is rising
    assert f"Larger sizes score higher: **{'yes' if rising else 'no'}** ({demo.DEFAULT.sizes[0]} 30.00%" in report
    assert f"| tau/{demo.DEFAULT.sizes[-1]} | 300,000 |" in report
    if rising:
        assert summary["downstream"]["fit"]["k"] > 0 and (tmp_path / "frontier.png").stat().st_size > 10_000
    else:
        assert "No frontier fit" in report and not (tmp_path / "frontier.png").exists()
