import dataclasses
import importlib.util
import json
import os

import jax
import numpy as np
import pytest

from celerity_jax import cli
from celerity_jax.collapse import curves, files, monitor, predictor, reference, surrogate
from celerity_jax.collapse.config import CurveGrid, replay_config
from celerity_jax.collapse.controls import Controls
from celerity_jax.collapse.types import Reference
from celerity_jax.errors import ConfigError
from celerity_jax.sweep import runner

STEPS = 1000
N_BINS = 200
SIZES = (1e5, 2e5, 4e5, 8e5)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(directory, n: float, seed: int, steps: int = STEPS) -> str:
    """A CSV curve of a family whose normalized curve drifts with N, with its sidecar of controls."""
    _, loss_T = surrogate.sample_curve(jax.random.key(seed), STEPS, 0.1 * (n / 1e5)**0.15, 1.0,
                                       4.0 * (n / 1e5)**-0.1, 0.01)
    path = os.path.join(directory, f"n{int(n)}_s{seed}.csv")
    with open(path, "w") as f:
        f.write("step,loss\n" + "".join(f"{s},{v!r}\n" for s, v in zip(range(1, steps + 1),
                                                                         np.asarray(loss_T)[:steps].tolist())))
    with open(path[:-4] + ".json", "w") as f:
        json.dump({"n_params": n, "tpp": 20, "tau": 0.17, "schedule": "d2z", "warmup_frac": 0.1,
                   "total_steps": STEPS}, f)
    return path


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("family"))
    runs = {n: _write_run(d, n, i) for i, n in enumerate(SIZES)}
    refs = []
    for n in SIZES[:3]:
        refs.append(os.path.join(d, f"ref_{int(n)}.json"))
        files.save_reference(reference.reference_from_curves([files.load_curve(runs[n])], N_BINS, 11), refs[-1])
    return d, runs, refs


def _benchmark():
    spec = importlib.util.spec_from_file_location("collapse_predictor",
                                                  os.path.join(ROOT, "benchmarks", "collapse_predictor.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_benchmark_reports_the_goal_met_or_missed():
    goal = _benchmark().goal
    errors = {0.1: {"family_over_single": 0.4}, 0.2: {"family_over_single": 0.5}, 0.5: {"family_over_single": 2.0}}
    assert goal(errors) == {"met": True, "ratios": {0.1: 0.4, 0.2: 0.5}}
    assert not goal({**errors, 0.3: {"family_over_single": 0.51}})["met"]
    assert not goal({0.5: {"family_over_single": 0.1}})["met"]  # nothing measured at 10–30%


def test_window_rule():
    assert predictor.window_at(0.3) == (0.15, 0.3)
    assert predictor.window_at(0.3, align_start=0.2) == pytest.approx((0.06, 0.3))
    assert predictor.window_at(0.3, (0.25, 0.5)) == (0.25, 0.5)


def test_every_user_of_prediction_gives_the_same_number(family, capsys):
    d, runs, refs = family
    partial = _write_run(d, SIZES[3], 13, steps=int(0.4 * STEPS))
    run = files.load_curve(partial)
    loaded = [files.load_reference(p) for p in refs]
    frac_G = curves.bin_centers(N_BINS)
    family_G = predictor.reference_for(loaded, frac_G, SIZES[3], "family")
    nearest_G = predictor.reference_for(loaded, frac_G, SIZES[3], "nearest")
    np.testing.assert_array_equal(nearest_G, reference.reference_curve([loaded[2]], frac_G))
    assert np.abs(np.asarray(family_G) - np.asarray(nearest_G)).max() > 1e-3
    with pytest.raises(ConfigError, match="method 'closest' is unknown; use one of nearest, family, shrunk"):
        predictor.reference_for(loaded, frac_G, SIZES[3], "closest")

    # the in-loop monitor and `celerity collapse predict`, over the fixed window [0.25, 0.5], at t̂ = 0.4
    cfg = replay_config(CurveGrid(N_BINS), (0.25, 0.5))
    pred = predictor.predict(run, family_G, window=cfg.align_window, min_span=cfg.min_align_span)
    assert pred.window == (0.25, 0.5) and pred.seen == pytest.approx(0.4)
    state = dict(zip(("loss_sum", "count"), curves.bin_curve(run.frac_T, run.loss_T, N_BINS)))
    metrics = monitor.monitor_metrics(state, family_G, cfg)
    assert float(metrics["collapse/pred_final_loss"]) == pred.final
    assert float(metrics["collapse/pred_final_loss_err"]) == pred.err
    assert cli.main(["collapse", "predict", "--reference", ",".join(refs), "--curve", partial, "--bins",
                     str(N_BINS), "--method", "family", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "family" and out["method_reason"] == "family: as asked"
    assert out["pred_final_loss"] == pred.final and out["pred_final_loss_err"] == pred.err
    single = predictor.predict(run, nearest_G, window=cfg.align_window, min_span=cfg.min_align_span)
    assert out["single_reference"]["pred_final_loss"] == single.final

    # the sweep, at t̂ = 0.3 over [0.5·0.3, 0.3]
    at = predictor.predict(run, family_G, upto=0.3, align_start=0.5)
    assert runner._predict(run, family_G, 0.3, 0.5, 0.0) == {"pred": at.final, "err": at.err}
    assert runner._predict(run, family_G, 0.5, 0.5, 0.0) is None  # not reached yet
    assert predictor.predict(run, family_G, upto=0.5) is None

    # the benchmark, on the finished target
    result = _benchmark().evaluate(list(runs.values()), [0.3], N_BINS, 11, False)
    row = next(r for r in result["rows"] if r["n_params"] == SIZES[3])
    target = files.load_curve(runs[SIZES[3]])
    true_final = float(curves.smooth(*curves.bin_curve(target.frac_T, target.loss_T, N_BINS), 11)[0][-1])
    for name, ref_G in (("single", nearest_G), ("family", family_G)):
        expected = predictor.predict(target, ref_G, upto=0.3).final / true_final - 1.0
        assert row[f"{name}_error"] == pytest.approx(expected, abs=1e-6)  # its references are not read from JSON
    # "chosen" is the method choose_method picks from the target's references alone
    choice = predictor.choose_method(loaded, frac_G, 0.3)
    chosen = predictor.predict(target, predictor.reference_for(loaded, frac_G, SIZES[3], choice.method), upto=0.3)
    assert row["chosen_method"] == choice.method == result["choices"][-1]["method"]
    assert row["chosen_error"] == pytest.approx(chosen.final / true_final - 1.0, abs=1e-6)
    cell = result["mean_abs_error"][0.3]
    assert cell["chosen_vs_plain"] == pytest.approx(cell["chosen"] / cell["single"])


def test_a_prediction_needs_the_window_started(family):
    _, runs, refs = family
    run = files.load_curve(runs[SIZES[0]])
    ref_G = reference.reference_curve([files.load_reference(refs[1])], curves.bin_centers(N_BINS))
    early = dataclasses.replace(run, step_T=run.step_T[:250], loss_T=run.loss_T[:250], frac_T=run.frac_T[:250])
    assert predictor.predict(early, ref_G, window=(0.25, 0.5), min_span=0.05) is None
    assert predictor.predict(early, ref_G, window=(0.2, 0.5), min_span=0.05).seen == pytest.approx(0.25)


def test_the_benchmark_aligns_each_point_at_its_own_frac():
    bench = _benchmark()
    from celerity_jax.collapse.controls import Controls
    from celerity_jax.collapse.types import Curve

    n_bins, total = 50, 1000
    ref_G = 1.0 + 2.0 * np.exp(-8.0 * curves.bin_centers(n_bins))

    def curve(step_T):
        frac_T = step_T / total
        loss_T = 2.5 * np.interp(frac_T, curves.bin_centers(n_bins), ref_G)
        return Curve("c", "c", step_T, loss_T, frac_T, total, "given", Controls())

    # points at the bins' centres: both alignments are the same
    at_centres = curve(np.arange(10, total, 20))
    binned = predictor.predict(at_centres, ref_G, upto=0.3).final
    assert bench.predict_exact(at_centres, ref_G, 0.3) == pytest.approx(binned, rel=1e-6)
    assert binned == pytest.approx(2.5, rel=1e-6)
    # points off the centres on a steep curve: only the exact alignment recovers the divisor
    off = curve(np.arange(3, total, 20))
    assert bench.predict_exact(off, ref_G, 0.3) == pytest.approx(2.5, rel=1e-9)
    assert abs(predictor.predict(off, ref_G, upto=0.3).final / 2.5 - 1) > 1e-3


def test_the_chosen_goal_is_never_worse_within_noise_and_halved_only_on_four_sizes():
    bench = _benchmark()

    def cell(chosen, single, se):
        return {"chosen": chosen, "single": single, "chosen_minus_plain_se": se, "chosen_vs_plain": chosen / single}

    within = {0.1: cell(0.012, 0.010, 0.0015), 0.3: cell(0.004, 0.010, 0.001)}
    goal = bench.goal_chosen(within, sizes=4)
    assert goal["never_worse_met"] and goal["halved_met"] is False  # 1.2× at 10%, inside 2 SE; not halved
    assert not bench.goal_chosen({0.1: cell(0.012, 0.010, 0.0005)}, sizes=4)["never_worse_met"]  # 4 SE worse
    halved = bench.goal_chosen({0.1: cell(0.004, 0.010, 0.001), 0.3: cell(0.003, 0.010, 0.001)}, sizes=4)
    assert halved["never_worse_met"] and halved["halved_met"]
    assert bench.goal_chosen(within, sizes=3)["halved_met"] is None  # not scored below 4 sizes


def test_the_cpu_families_stored_curves_give_the_recorded_results():
    data = os.path.join(ROOT, "benchmarks", "data", "cpu-families", "tpp10")
    paths = sorted(os.path.join(data, size, seed) for size in os.listdir(data)
                   if os.path.isdir(os.path.join(data, size)) for seed in os.listdir(os.path.join(data, size)))
    assert len(paths) == 6
    with open(os.path.join(ROOT, "benchmarks", "results", "cpu", "collapse_predictor_cpu_tpp10.json")) as f:
        recorded = json.load(f)["families"]["family, eval curve"]["mean_abs_error"]
    result = _benchmark().evaluate(paths, [0.1, 0.2, 0.3, 0.5], N_BINS, 11, False, leave_one_out=True, loss="eval")
    for frac, errors in result["mean_abs_error"].items():
        assert {k: errors[k] for k in recorded[str(frac)]} == pytest.approx(recorded[str(frac)], rel=1e-5)


GRID_G = curves.bin_centers(100)


def _drifting_refs(shift_K, sizes=(1e5, 2e5, 4e5, 8e5), final: float = 3.0) -> list:
    """References whose log normalized curve moves by shift_k·(1 − t̂) at size k (1 at t̂ = 1 for all)."""
    base_G = 1.0 + 0.8 * (1.0 - GRID_G)**2
    return [Reference(GRID_G, base_G * np.exp(shift * (1.0 - GRID_G)), None, Controls(n_params=n), 0.0, final,
                      {"kind": "curves"}, f"ref_{int(n)}.json") for shift, n in zip(shift_K, sizes)]


def test_shrunk_family_curve_keeps_a_resolved_slope_and_shrinks_a_noisy_one():
    drift = _drifting_refs([0.0, 0.02, 0.04])  # log l exactly linear in log N: no residual, no shrinkage
    family_G = predictor.reference_for(drift, GRID_G, 1.6e6, "family")
    np.testing.assert_allclose(predictor.reference_for(drift, GRID_G, 1.6e6, "shrunk"), family_G, rtol=1e-5)
    zigzag = _drifting_refs([0.0, 0.05, 0.0, 0.05])  # a slope well below its standard error
    mean_G = predictor.reference_for(zigzag, GRID_G, None, "family")  # the geometric mean
    far_G = [np.asarray(predictor.reference_for(zigzag, GRID_G, 1e8, m)) for m in ("family", "shrunk")]
    assert np.abs(far_G[1] - mean_G).max() < 0.5 * np.abs(far_G[0] - mean_G).max()
    with pytest.raises(ConfigError, match="shrunk method needs the run's N and references of 3 sizes"):
        predictor.reference_for(drift[:2], GRID_G, 1.6e6, "shrunk")


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_choose_method_picks_family_when_it_predicts_the_held_out_sizes_better(offset):
    choice = predictor.choose_method(_drifting_refs([0.0, 0.02, 0.04], sizes=SIZES[:3]), GRID_G, 0.3, offset=offset)
    assert choice.method == "family" and set(choice.scores) == {"nearest", "family"}
    assert choice.scores["family"] < 1e-4 < choice.scores["nearest"]
    assert choice.reason.startswith("family: leave-one-size-out error at t̂ 0.3 0.00% against nearest ")
    assert choice.reason.endswith("(3 sizes)")


def test_choose_method_keeps_nearest_when_family_loses_or_wins_within_the_noise():
    zigzag = predictor.choose_method(_drifting_refs([0.02, -0.02, 0.02], sizes=SIZES[:3]), GRID_G, 0.3)
    assert zigzag.method == "nearest" and zigzag.scores["family"] > zigzag.scores["nearest"]
    assert zigzag.reason.startswith("nearest: leave-one-size-out error at t̂ 0.3")
    # held-out gains of family over nearest about −0.2, 0.4 and 1.0 (×0.02): a better mean, but not beyond 2 SE
    noisy = predictor.choose_method(_drifting_refs([0.0, 0.02, 0.064], sizes=SIZES[:3]), GRID_G, 0.3)
    assert noisy.method == "nearest" and noisy.scores["family"] < noisy.scores["nearest"]
    assert noisy.reason.startswith("nearest: family's leave-one-size-out error")
    assert "within 2 standard errors" in noisy.reason
    # with 4 sizes shrunk is scored too; on a line it is the family curve, so either may score lowest
    four = predictor.choose_method(_drifting_refs([0.0, 0.02, 0.04, 0.06]), GRID_G, 0.3)
    assert set(four.scores) == set(predictor.METHODS) and four.method in ("family", "shrunk")


def test_choose_method_across_families_scores_them_together_and_picks_one_method():
    drift = _drifting_refs([0.0, 0.02, 0.04], sizes=SIZES[:3])     # alone: family
    zigzag = _drifting_refs([0.02, -0.02, 0.02], sizes=SIZES[:3])  # alone: nearest
    alone = [predictor.choose_method(refs, GRID_G, 0.3) for refs in (drift, zigzag)]
    assert [c.method for c in alone] == ["family", "nearest"]
    both = predictor.choose_method_across([drift, zigzag], GRID_G, 0.3)
    for m in ("nearest", "family"):
        assert both.scores[m] == pytest.approx((alone[0].scores[m] + alone[1].scores[m]) / 2)
    assert both.method == "nearest" and both.reason.endswith("(3 sizes, 2 families)")
    # the noise test pairs per-size gains averaged over the families: a family twice is the family once
    twice = predictor.choose_method_across([drift, drift], GRID_G, 0.3)
    assert twice.method == "family" and twice.scores == pytest.approx(alone[0].scores)
    apart = predictor.choose_method_across([drift[:2], drift[1:]], GRID_G, 0.3)
    assert apart == predictor.Choice("nearest", {}, "nearest: the references have fewer than two sizes in common, "
                                                    "so there is no other method to choose")


def test_choose_method_with_too_few_sizes_is_nearest():
    refs = _drifting_refs([0.0, 0.02, 0.04], sizes=SIZES[:3])
    one = predictor.choose_method([refs[0], dataclasses.replace(refs[1], controls=refs[0].controls)], GRID_G, 0.3)
    assert one == predictor.Choice("nearest", {}, "nearest: the references have one size, so there is no other "
                                                  "method to choose")
    two = predictor.choose_method(refs[:2], GRID_G, 0.3)
    assert two.method == "nearest" and set(two.scores) == {"nearest"}
    assert "leave-one-size-out can score no other method" in two.reason
    unknown = predictor.choose_method([refs[0], dataclasses.replace(refs[1], controls=Controls())], GRID_G, 0.3)
    assert unknown.method == "nearest" and "N unknown" in unknown.reason
    empty = predictor.choose_method(refs, GRID_G, 0.3, window=(0.6, 0.8))  # no bin of the window seen at 0.3
    assert empty.method == "nearest" and empty.scores == {} and "no size could be predicted" in empty.reason


def test_method_for_takes_a_named_method_or_chooses():
    refs = _drifting_refs([0.0, 0.02, 0.04], sizes=SIZES[:3])
    assert predictor.method_for("auto", refs, GRID_G, 8e5, 0.3) == predictor.choose_method(refs, GRID_G, 0.3)
    asked = predictor.method_for("nearest", refs, GRID_G, 8e5, 0.3)
    assert asked == predictor.Choice("nearest", {}, "nearest: as asked")
    assert predictor.method_for("shrunk", refs, GRID_G, 8e5, 0.3).method == "shrunk"
    fallback = predictor.method_for("shrunk", refs[:2], GRID_G, 8e5, 0.3)
    assert fallback.method == "nearest"
    assert "shrunk was asked for, but it needs references of 3 sizes" in fallback.reason
    unknown_n = predictor.method_for("auto", refs, GRID_G, None, 0.3)
    assert unknown_n.method == "family" and "the run's N is unknown" in unknown_n.reason
    with pytest.raises(ConfigError, match="prediction method 'best' is unknown; use one of auto, nearest, family"):
        predictor.method_for("best", refs, GRID_G, 8e5, 0.3)
    assert predictor.available(refs) == list(predictor.METHODS)
    assert predictor.available(refs[:2]) == ["nearest", "family"]
    same_size = [refs[0], dataclasses.replace(refs[1], controls=refs[0].controls)]
    unknown = [dataclasses.replace(refs[0], controls=Controls()), *refs[1:]]
    assert predictor.available(refs[:1]) == predictor.available(same_size) == ["nearest"]
    assert predictor.available(unknown) == ["nearest"]
