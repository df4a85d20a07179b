import dataclasses
import os

import jax
import numpy as np
import pytest

from celerity_jax.collapse import curves, files, reference, surrogate
from celerity_jax.collapse.controls import Controls
from celerity_jax.collapse.types import Curve
from celerity_jax.errors import ConfigError

N_BINS = 200
TRUTH = surrogate.SurrogateConstants(b_c=0.05, b_e=-0.3, q_c=2.0, q_e=-0.2)
TAUS, TPPS = (0.05, 0.1, 0.2, 0.4), (20.0, 80.0, 234.0)


def _grid_family(constants, noise: float, taus=TAUS, seed: int = 0):
    """Surrogate curves on the bin grid for every (τ, TPP), plus per-point noise."""
    frac_G = curves.bin_centers(N_BINS)
    eta_G, eta_end = surrogate.schedule_on_grid(frac_G, "d2z", 0.1)
    rng = np.random.default_rng(seed)
    controls = [(tau, tpp) for tau in taus for tpp in TPPS]
    curves_CxG = np.stack([np.asarray(surrogate.surrogate_curve(frac_G, eta_G, eta_end, constants.b(tau),
                                                                constants.q(tpp))) for tau, tpp in controls])
    n = len(controls)
    return (curves_CxG + noise * rng.standard_normal(curves_CxG.shape), frac_G,
            np.tile(np.asarray(eta_G), (n, 1)), np.full(n, float(eta_end)),
            np.array([c[0] for c in controls]), np.array([c[1] for c in controls]))


def test_surrogate_is_one_at_the_end_and_falls_with_the_schedule():
    frac_G = np.array([0.2, 0.5, 0.8, 1.0])
    eta_G, eta_end = surrogate.schedule_on_grid(frac_G, "d2z", 0.1)
    l_G = np.asarray(surrogate.surrogate_curve(frac_G, eta_G, eta_end, 0.1, 1.0))
    assert l_G[-1] == pytest.approx(1.0) and np.all(np.diff(l_G) < 0)
    # constant LR: only the power law remains to fall
    flat_G = np.asarray(surrogate.surrogate_curve(frac_G, np.ones(4), 1.0, 0.1, 1.0))
    assert flat_G[0] - 1.0 < 0.5 * (l_G[0] - 1.0)


@pytest.mark.parametrize("constants", [TRUTH, surrogate.SurrogateConstants(0.3, 0.4, 0.5, 0.15)])
def test_fit_recovers_the_constants(constants):
    fit = surrogate.fit_surrogate(*_grid_family(constants, noise=0.002))
    got = fit.constants
    assert got.b_c == pytest.approx(constants.b_c, rel=0.05) and got.q_c == pytest.approx(constants.q_c, rel=0.05)
    assert got.b_e == pytest.approx(constants.b_e, abs=0.02) and got.q_e == pytest.approx(constants.q_e, abs=0.02)
    assert fit.mae_C.shape == (len(TAUS) * len(TPPS),)
    assert fit.mae == pytest.approx(0.002 * np.sqrt(2 / np.pi), rel=0.2)  # the noise floor


def test_fit_on_noisy_runs_reaches_the_noise_floor():
    frac_G = curves.bin_centers(N_BINS)
    eta_G, eta_end = surrogate.schedule_on_grid(frac_G, "d2z", 0.1)
    rows = []
    for i, (tau, tpp) in enumerate([(t, p) for t in TAUS for p in TPPS]):
        frac_T, loss_T = surrogate.sample_curve(jax.random.key(i), 2000, TRUTH.b(tau), TRUTH.q(tpp), 3.0, 0.02)
        mean_G, _ = curves.smooth(*curves.bin_curve(frac_T, loss_T, N_BINS), 11)
        rows.append((np.asarray(curves.normalize(mean_G, mean_G[-1])), tau, tpp))
    n = len(rows)
    fit = surrogate.fit_surrogate(np.stack([r[0] for r in rows]), frac_G, np.tile(np.asarray(eta_G), (n, 1)),
                                  np.full(n, float(eta_end)), np.array([r[1] for r in rows]),
                                  np.array([r[2] for r in rows]))
    assert fit.mae < 0.005 and fit.mae_C.max() < 0.01
    assert fit.constants.b_e == pytest.approx(TRUTH.b_e, abs=0.05)


def test_one_tau_holds_its_exponent_at_zero_and_files_round_trip(tmp_path):
    fit = surrogate.fit_surrogate(*_grid_family(TRUTH, noise=0.0, taus=TAUS[:1]))
    assert fit.constants.b_e == 0.0
    assert fit.constants.b(TAUS[0]) == pytest.approx(TRUTH.b(TAUS[0]), rel=0.05)

    path = os.path.join(tmp_path, "surrogate.json")
    files.save_surrogate(fit, [{"curve": f"c{i}"} for i in range(len(fit.mae_C))], (0.2, 1.0), {}, path)
    assert files.load_surrogate(path) == fit.constants
    with open(path, "w") as f:
        f.write('{"format": "something else"}')
    with pytest.raises(ConfigError, match="format .something else., expected"):
        files.load_surrogate(path)


def test_sample_curve_has_the_requested_noise():
    frac_T, clean_T = surrogate.sample_curve(jax.random.key(0), 4000, 0.1, 1.0, 3.0, 0.0)
    _, noisy_T = surrogate.sample_curve(jax.random.key(1), 4000, 0.1, 1.0, 3.0, 0.05)
    assert float(clean_T[-1]) == pytest.approx(3.0, rel=1e-6) and float(frac_T[-1]) == 1.0
    assert np.std(np.asarray(noisy_T) / np.asarray(clean_T) - 1.0) == pytest.approx(0.05, rel=0.05)


def test_mae_per_curve_scores_given_constants_like_the_fit():
    family = _grid_family(TRUTH, noise=0.002)
    fit = surrogate.fit_surrogate(*family)
    np.testing.assert_allclose(surrogate.mae_per_curve(fit.constants, *family), fit.mae_C, rtol=1e-5)
    assert surrogate.mae_per_curve(TRUTH, *_grid_family(TRUTH, noise=0.0)).max() < 1e-6
    wrong = surrogate.SurrogateConstants(TRUTH.b_c * 2, TRUTH.b_e, TRUTH.q_c, TRUTH.q_e)
    assert surrogate.mae_per_curve(wrong, *family).min() > 0.01


CONTROLS = Controls(n_params=1e5, tpp=20.0, tau=0.17, schedule="d2z", warmup_frac=0.1)


def _curve(seed: int, controls=CONTROLS, b: float = 0.1, steps: int = 1000) -> Curve:
    frac_T, loss_T = surrogate.sample_curve(jax.random.key(seed), steps, b, 1.0, 3.0, 0.01)
    return Curve(f"seed{seed}", f"run{seed}/curve.csv", np.arange(1, steps + 1, dtype=float),
                       np.asarray(loss_T, float), np.asarray(frac_T, float), steps, "plan", controls)


def test_surrogate_inputs_normalize_runs_and_select_curves():
    runs = [_curve(0), _curve(1, dataclasses.replace(CONTROLS, tau=0.35), b=0.2)]
    inputs = surrogate.surrogate_inputs(runs, N_BINS, 11)
    assert inputs.curves_CxG.shape == inputs.eta_CxG.shape == (2, N_BINS)
    np.testing.assert_allclose(inputs.curves_CxG[0], curves.normalize_run(runs[0], N_BINS, 11)[0])
    assert list(inputs.tau_C) == [0.17, 0.35] and inputs.info[1]["curve"] == "run1/curve.csv"
    second = inputs.take(np.array([False, True]))
    assert second.info == inputs.info[1:] and np.array_equal(second.curves_CxG, inputs.curves_CxG[1:])
    with pytest.raises(ConfigError, match=r"run0/curve.csv: the surrogate needs the controls \['tau'\]"):
        surrogate.surrogate_inputs([_curve(0, dataclasses.replace(CONTROLS, tau=None))], N_BINS, 11)


def test_the_surrogate_follows_the_wsd_decay_fraction():
    constants = surrogate.SurrogateConstants(0.1, 0.0, 1.0, 0.0)
    wsd = dataclasses.replace(CONTROLS, schedule="wsd")
    default, short, long = (reference.reference_from_surrogate(constants, dataclasses.replace(wsd, wsd_decay_frac=d),
                                                               N_BINS) for d in (None, 0.2, 0.5))
    np.testing.assert_array_equal(default.normalized_G, short.normalized_G)
    assert np.abs(long.normalized_G - short.normalized_G).max() > 0.01
    assert long.controls.mismatches(short.controls) == ["wsd_decay_frac 0.5 vs 0.2"]
    runs = [_curve(0, dataclasses.replace(wsd, wsd_decay_frac=d)) for d in (0.2, 0.5)]
    eta_CxG = surrogate.surrogate_inputs(runs, N_BINS, 11).eta_CxG
    assert np.abs(eta_CxG[0] - eta_CxG[1]).max() > 0.5
