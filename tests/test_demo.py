import json
import os

import numpy as np
import pytest

from celerity_jax import demo, gin_config, recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_runs_pin_tau_for_one_recipe_and_fix_tokens_for_the_other():
    runs = demo.demo_runs(demo.SIZES, quick=False)
    plans = {}
    for run in runs:
        configs = gin_config.parse_gin(run.gin_files, run.gin_params)
        plans[run.name] = recipe.make_plan(configs.model, configs.recipe)
    tau_plans = [plans[f"tau/{s}"] for s in demo.SIZES]
    naive_plans = [plans[f"naive/{s}"] for s in demo.SIZES]
    assert len({p.tpp for p in tau_plans}) == 1
    assert max(p.tau for p in tau_plans) == pytest.approx(min(p.tau for p in tau_plans))
    assert len({p.n_params for p in tau_plans}) == 3
    tokens = [p.tokens for p in naive_plans]
    assert max(tokens) / min(tokens) < 1.01
    assert {p.weight_decay for p in naive_plans} == {1.0}
    assert max(p.tau for p in naive_plans) / min(p.tau for p in naive_plans) > 1.5
    configs = {run.name: gin_config.parse_gin(run.gin_files, run.gin_params) for run in runs}
    seeds = {name: c.train.seed for name, c in configs.items()}
    assert len({seeds[f"tau/{s}"] for s in demo.SIZES}) == 3  # no shared batch order within a family
    assert all(seeds[f"tau/{s}"] == seeds[f"naive/{s}"] for s in demo.SIZES)
    assert len(set(seeds.values())) == 6 and all(plans[f"tau/{s}-seed1"] == plans[f"tau/{s}"] for s in demo.SIZES)
    assert {(c.train.eval_points, c.train.eval_batches) for c in configs.values()} == {(50, 8)}
    quick = [run.name for run in demo.demo_runs(demo.SIZES, quick=True)]
    assert quick == [f"{r}/{s}" for r in demo.RECIPES for s in demo.SIZES] + ["tau/d64-seed1"]


def _fake_run(workdir, shape_scale, final, n_params, tau, noise=0.002):
    os.makedirs(workdir)
    steps = 400
    step = np.arange(1, steps + 1)
    frac = step / steps
    loss = final * (1 + shape_scale * (1 - frac) ** 2) + noise * np.sin(step * (1 + n_params + noise))
    for name, rows in (("curve.csv", range(steps)), ("eval.csv", range(7, steps, 8))):  # 50 evals
        with open(os.path.join(workdir, name), "w") as f:
            f.write("step,tokens,frac,loss\n")
            for i in rows:
                f.write(f"{step[i]},{step[i] * 64},{frac[i]},{loss[i]}\n")
    plan = {"n_params": n_params, "tpp": 8.0, "tau": tau, "schedule": "d2z", "steps": steps, "warmup_steps": 40,
            "weight_decay": 0.5, "batch_seqs": 8}
    with open(os.path.join(workdir, "plan.json"), "w") as f:
        json.dump(plan, f)


def test_report_measures_each_recipe_their_ratio_and_the_seed_noise(tmp_path):
    runs = []
    for i, size in enumerate(demo.SIZES):
        runs += [demo.DemoRun("tau", size, (), ()), demo.DemoRun("naive", size, (), ())]
        _fake_run(tmp_path / "tau" / size, 0.5 + 0.01 * i, 3.0 - 0.2 * i, 1e5 * (i + 1), 0.3)
        _fake_run(tmp_path / "naive" / size, 0.3 + 0.15 * i, 3.0 - 0.2 * i, 1e5 * (i + 1), 0.3 * (i + 1))
    runs.append(demo.DemoRun("tau", "d64", (), (), replica=1))
    _fake_run(tmp_path / "tau" / "d64-seed1", 0.51, 2.8, 2e5, 0.3, noise=0.02)
    summary = demo.write_report(str(tmp_path), runs, {}, quick=True, variant=("RecipeConfig.decay_convention = "
                                                                             "'width_scaled'",))
    assert summary["loss"] == "eval" and summary["naive"]["mean_abs_dev"] > 5 * summary["tau"]["mean_abs_dev"]
    assert summary["ratio"] == pytest.approx(summary["naive"]["mean_abs_dev"] / summary["tau"]["mean_abs_dev"])
    assert summary["train"]["ratio"] > 5 and summary["supercollapse"]["ratio"] < 1  # the seed noise dominates
    report = (tmp_path / "report.md").read_text()
    assert f"- eval curves: ratio naive / tau of the mean absolute deviation **{summary['ratio']:.2f}**" in report
    assert f"= **{summary['supercollapse']['ratio']:.2f}** (target <= 1.5: met)" in report
    assert "| tau | d64-seed1 |" in report and "(seed noise)" in report
    assert "Layered on every run: RecipeConfig.decay_convention = 'width_scaled'." in report
    assert demo.SEED_NOISE_RESULTS in report and os.path.isfile(os.path.join(ROOT, demo.SEED_NOISE_RESULTS))
    assert (tmp_path / "collapse.png").stat().st_size > 10_000


@pytest.mark.parametrize("accuracies, rising", [((0.30, 0.34, 0.41), True), ((0.30, 0.29, 0.28), False)])
def test_report_scores_the_family_downstream_and_says_whether_larger_sizes_score_higher(tmp_path, accuracies,
                                                                                        rising):
    from celerity_jax.evaluate import builtin_task, results

    runs, downstream = [], {}
    for i, size in enumerate(demo.SIZES):
        runs += [demo.DemoRun("tau", size, (), ()), demo.DemoRun("naive", size, (), ())]
        _fake_run(tmp_path / "tau" / size, 0.5, 3.0 - 0.2 * i, 1e5 * (i + 1), 0.3)
        _fake_run(tmp_path / "naive" / size, 0.3 + 0.15 * i, 3.0 - 0.2 * i, 1e5 * (i + 1), 0.3 * (i + 1))
        plan = {"batch_tokens": 64, "steps": 400, "n_params": 100_000 * (i + 1), "flops_per_token": 6e5 * (i + 1)}
        score = {"metric": "acc", "value": accuracies[i], "stderr": 0.01, "docs": 1000, "shots": 0, "truncated": 0}
        downstream[f"tau/{size}"] = results.record(str(tmp_path / "tau" / size), 400, plan,
                                                   {builtin_task.TASK_NAME: score}, write_tensorboard=False)
    summary = demo.write_report(str(tmp_path), runs, {}, quick=True, downstream=downstream)
    report = (tmp_path / "report.md").read_text()
    assert summary["downstream"]["rising"] is rising
    assert f"Larger sizes score higher: **{'yes' if rising else 'no'}** (d48 30.00%" in report
    assert "| tau/d80 | 300,000 |" in report
    if rising:
        assert summary["downstream"]["fit"]["k"] > 0 and (tmp_path / "frontier.png").stat().st_size > 10_000
    else:
        assert "No frontier fit" in report and not (tmp_path / "frontier.png").exists()
