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


def _fake_run(workdir, final, shape, n_params=84_760, tpp=10.0, noise=0.0, seed=0):
    """A finished run directory whose eval curve is final·(1 + shape·(1 − t̂)²), with seeded noise."""
    os.makedirs(workdir)
    steps = 400
    step = np.arange(1, steps + 1)
    frac = step / steps
    loss = final * (1 + shape * (1 - frac) ** 2) * (1 + noise * np.random.default_rng(seed).standard_normal(steps))
    for name, rows in (("curve.csv", range(steps)), ("eval.csv", range(7, steps, 8))):  # 50 evals
        with open(os.path.join(workdir, name), "w") as f:
            f.write("step,tokens,frac,loss\n")
            for i in rows:
                f.write(f"{step[i]},{step[i] * 64},{frac[i]},{loss[i]}\n")
    plan = {"n_params": n_params, "tpp": tpp, "tau": 0.25, "schedule": "d2z", "steps": steps, "warmup_steps": 40,
            "weight_decay": 0.5, "batch_seqs": 16, "base_lr": 0.012}
    with open(os.path.join(workdir, "plan.json"), "w") as f:
        json.dump(plan, f)


def _fake_demo(root, quick, off_shape=0.6, naive_step=0.15):
    """Panels where the off-τ and off-TPP curves differ in shape by `off_shape − 0.5`, and the naive family's
    shape steps by `naive_step` per size; every curve has 0.2% noise."""
    runs = demo.demo_runs(quick=quick)
    shapes = {"timescale/tau-div4": off_shape, "timescale/tau-x4": 1 - off_shape,
              "tpp/tpp-half": off_shape, "tpp/tpp-x2": 1 - off_shape}
    for i, r in enumerate(runs):
        k = demo.SIZES.index(r.label) if r.group in demo_report.RECIPES else 0
        shape = shapes.get(r.name.split("-seed")[0], 0.5 + (naive_step * k if r.group == "naive" else 0))
        _fake_run(root / r.name, 2.0 - 0.2 * k, shape, 84_760 * 3 ** k, noise=0.002, seed=i)
    return runs


def test_report_names_each_target_met_or_missed_and_keeps_its_keys(tmp_path):
    runs = _fake_demo(tmp_path, quick=False)
    summary = demo_report.write_report(str(tmp_path), runs, {r.name: 1.0 for r in runs}, quick=False)
    assert summary["timescale"]["delta_over_sigma"] < 1.5 and min(summary["timescale"]["off"].values()) > 3
    assert summary["timescale"]["met"] and summary["tpp"]["met"] and summary["family"]["met"]
    assert summary["family"]["ratio"] > 3 and summary["train_seconds"] == len(runs)
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert set(on_disk) == {"quick", "train_seconds", "timescale", "tpp", "family", "runs"}
    assert set(on_disk["timescale"]) == {"equal", "delta", "sigma", "delta_over_sigma", "off", "met"}
    assert set(on_disk["tpp"]) == {"sigma", "pairs", "met"}
    assert set(on_disk["family"]) == {"tau_spread", "naive_spread", "ratio", "delta", "sigma", "delta_over_sigma",
                                      "met"}
    assert set(on_disk["runs"]["timescale/base"]) >= {"n_params", "tpp", "tau", "final_eval_loss", "seconds"}
    report = (tmp_path / "report.md").read_text()
    assert report.count(": met)") == 5 and "NOT met" not in report
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_a_quick_report_has_panels_1_and_2_and_says_what_it_misses(tmp_path):
    runs = _fake_demo(tmp_path, quick=True, off_shape=0.5)
    summary = demo_report.write_report(str(tmp_path), runs, {}, quick=True)
    assert "family" not in summary and not summary["timescale"]["met"] and not summary["tpp"]["met"]
    report = (tmp_path / "report.md").read_text()
    assert "quick (panels 1 and 2)" in report and "target >= 3σ each: NOT met" in report
    assert "## 3." not in report


@pytest.mark.parametrize("accuracies, rising", [((0.30, 0.34, 0.41), True), ((0.30, 0.29, 0.28), False)])
def test_report_scores_the_family_downstream_and_says_whether_larger_sizes_score_higher(tmp_path, accuracies,
                                                                                        rising):
    from celerity_jax.evaluate import builtin_task, results

    runs = _fake_demo(tmp_path, quick=False)
    downstream = {}
    for i, size in enumerate(demo.SIZES):
        plan = {"batch_tokens": 64, "steps": 400, "n_params": 100_000 * (i + 1), "flops_per_token": 6e5 * (i + 1)}
        score = {"metric": "acc", "value": accuracies[i], "stderr": 0.01, "docs": 1000, "shots": 0, "truncated": 0}
        downstream[f"tau/{size}"] = results.record(str(tmp_path / "tau" / size), 400, plan,
                                                   {builtin_task.TASK_NAME: score}, write_tensorboard=False)
    summary = demo_report.write_report(str(tmp_path), runs, {}, quick=False, downstream=downstream)
    report = (tmp_path / "report.md").read_text()
    assert summary["downstream"]["rising"] is rising
    assert f"Larger sizes score higher: **{'yes' if rising else 'no'}** ({demo.SIZES[0]} 30.00%" in report
    assert f"| tau/{demo.SIZES[-1]} | 300,000 |" in report
    if rising:
        assert summary["downstream"]["fit"]["k"] > 0 and (tmp_path / "frontier.png").stat().st_size > 10_000
    else:
        assert "No frontier fit" in report and not (tmp_path / "frontier.png").exists()
