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
    with pytest.raises(ConfigError, match="prediction method 'closest' is unknown; use one of nearest, family"):
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
                     str(N_BINS), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
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


def test_the_cpu_families_stored_curves_give_the_recorded_results():
    data = os.path.join(ROOT, "benchmarks", "data", "cpu-families", "tpp10")
    paths = sorted(os.path.join(data, size, seed) for size in os.listdir(data)
                   if os.path.isdir(os.path.join(data, size)) for seed in os.listdir(os.path.join(data, size)))
    assert len(paths) == 6
    with open(os.path.join(ROOT, "benchmarks", "results", "cpu", "collapse_predictor_cpu_tpp10.json")) as f:
        recorded = json.load(f)["families"]["family, eval curve"]["mean_abs_error"]
    result = _benchmark().evaluate(paths, [0.1, 0.2, 0.3, 0.5], N_BINS, 11, False, leave_one_out=True, loss="eval")
    for frac, errors in result["mean_abs_error"].items():
        assert errors == pytest.approx(recorded[str(frac)], rel=1e-5)
