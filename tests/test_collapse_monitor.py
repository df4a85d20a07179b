import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.collapse import curves, monitor, surrogate
from celerity_jax.collapse.config import MonitorConfig

CFG = MonitorConfig(n_bins=500)
STEPS, NOISE, LOG_EVERY = 4000, 0.02, 16
FAULT_AT = 0.6


def _clean():
    return surrogate.sample_curve(jax.random.key(0), STEPS, 0.1, 1.0, 3.0, 0.0)


def _reference_G(cfg=CFG):
    frac_T, clean_T = _clean()
    mean_G, _ = curves.smooth(*curves.bin_curve(frac_T, clean_T, cfg.n_bins), cfg.smooth_bins)
    return curves.normalize(mean_G, mean_G[-1])


def _noisy(seeds: int, first_seed: int = 1) -> np.ndarray:
    _, clean_T = _clean()
    rng = np.random.default_rng(first_seed)
    return np.asarray(clean_T) * 1.1 * (1.0 + NOISE * rng.standard_normal((seeds, STEPS)))


@jax.jit
def _scan_monitor(frac_T, loss_T):
    """The monitor updated step by step, as inside a jitted train step."""
    def step(state, x):
        return monitor.monitor_update(state, *x), None
    return jax.lax.scan(step, monitor.monitor_init(CFG), (loss_T, frac_T))[0]


def test_jitted_monitor_agrees_with_the_offline_functions():
    frac_T, _ = _clean()
    loss_T = _noisy(1)[0]
    loss_T[123] = np.nan  # skipped, as a bad step would be
    state = _scan_monitor(frac_T, loss_T)
    sum_G, count_G = curves.bin_curve(frac_T, loss_T, CFG.n_bins)
    np.testing.assert_allclose(state["loss_sum"], sum_G, rtol=1e-5)
    np.testing.assert_array_equal(state["count"], count_G)
    assert float(count_G.sum()) == STEPS - 1

    ref_G = _reference_G()
    metrics = monitor.monitor_metrics(state, ref_G, CFG)
    align = curves.early_align(sum_G, count_G, ref_G, CFG.align_window)
    r_G, sigma_G, l_G = curves.residuals(sum_G, count_G, ref_G, align, CFG.smooth_bins)
    assert float(metrics["collapse/pred_final_loss"]) == pytest.approx(float(align.final), rel=1e-5)
    assert float(metrics["collapse/pred_final_loss_err"]) == pytest.approx(float(align.final_err), rel=1e-4)
    assert float(metrics["collapse/normalized_loss"]) == pytest.approx(float(l_G[-1]), rel=1e-5)
    assert float(metrics["collapse/residual"]) == pytest.approx(float(r_G[-1]), abs=1e-5)
    assert float(metrics["collapse/residual_sigma"]) == pytest.approx(float(sigma_G[-1]), rel=1e-4)
    assert float(metrics["collapse/alert"]) == 0.0
    assert set(metrics) == set(monitor.METRICS)
    # the prediction hits the (smoothed) final loss of the clean curve it was drawn from
    assert float(align.final) == pytest.approx(1.1 * float(
        curves.smooth(*curves.bin_curve(frac_T, _clean()[1], CFG.n_bins), CFG.smooth_bins)[0][-1]), rel=3e-3)


def test_monitor_curve_is_the_aligned_curve_so_far():
    frac_T, _ = _clean()
    loss_T = _noisy(1)[0]
    ref_G = _reference_G()
    state = _scan_monitor(frac_T, np.where(frac_T <= 0.6, loss_T, np.nan))
    curve_G = np.asarray(monitor.monitor_curve(state, ref_G, CFG))
    metrics = monitor.monitor_metrics(state, ref_G, CFG)
    j = int(curves.last_bin(state["count"]))
    assert np.all(np.isfinite(curve_G[:j + 1])) and np.all(np.isnan(curve_G[j + 1:]))
    assert curve_G[j] == pytest.approx(float(metrics["collapse/normalized_loss"]), rel=1e-6)
    mean_G, _ = curves.smooth(state["loss_sum"], state["count"], CFG.smooth_bins)
    np.testing.assert_allclose(curve_G[:j + 1], mean_G[:j + 1] / metrics["collapse/pred_final_loss"], rtol=1e-5)
    early = _scan_monitor(frac_T, np.where(frac_T <= 0.2, loss_T, np.nan))  # before predictions start
    assert np.all(np.isnan(np.asarray(monitor.monitor_curve(early, ref_G, CFG))))


def test_replay_equals_the_monitor_at_each_log():
    frac_T, _ = _clean()
    loss_T = _noisy(1)[0]
    ref_G = _reference_G()
    logs = monitor.replay_monitor(frac_T, loss_T, ref_G, CFG, LOG_EVERY)
    assert logs["frac"].shape == (STEPS // LOG_EVERY,)
    for i in (10, 140, STEPS // LOG_EVERY - 1):
        end = (i + 1) * LOG_EVERY
        state = _scan_monitor(frac_T, np.where(np.arange(STEPS) < end, loss_T, np.nan))
        direct = monitor.monitor_metrics(state, ref_G, CFG)
        assert float(logs["frac"][i]) == pytest.approx(end / STEPS)
        for name in monitor.METRICS:
            np.testing.assert_allclose(logs[name][i], direct[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # nothing is predicted before the alignment window has min_align_span of data
    early = np.asarray(logs["frac"]) < CFG.align_window[0] + CFG.min_align_span - 1.0 / CFG.n_bins
    assert np.all(np.isnan(np.asarray(logs["collapse/pred_final_loss"])[early]))
    assert np.all(np.isfinite(np.asarray(logs["collapse/pred_final_loss"])[~early]))


@functools.partial(jax.jit, static_argnames="cfg")
def _alerts(loss_KxT, ref_G, cfg=CFG):
    frac_T, _ = _clean()
    return jax.lax.map(lambda l_T: monitor.replay_monitor(frac_T, l_T, ref_G, cfg, LOG_EVERY)["collapse/alert"],
                       loss_KxT)


def _fault(frac_T, size: float):
    return 1.0 + size * np.maximum(frac_T - FAULT_AT, 0.0) / (1.0 - FAULT_AT)


def test_alert_fires_on_injected_drift_within_a_bounded_delay_and_never_on_clean_noise():
    ref_G = _reference_G()
    frac_G = (np.arange(STEPS // LOG_EVERY) + 1) * LOG_EVERY / STEPS
    for first_seed in (1, 2):  # 2 × 32 clean runs
        assert not np.any(np.asarray(_alerts(_noisy(32, first_seed), ref_G)))

    frac_T = np.asarray(_clean()[0])
    alert_KxL = np.asarray(_alerts(_noisy(32, 3) * _fault(frac_T, 0.05), ref_G)) > 0  # +5% by the end
    assert alert_KxL.any(axis=1).all()
    onset_K = frac_G[alert_KxL.argmax(axis=1)]
    assert onset_K.min() > FAULT_AT and onset_K.max() < FAULT_AT + 0.2, onset_K
    # once the drift is well above the noise the alert stays on
    assert alert_KxL[:, frac_G > 0.9].all()


def test_residual_floor_silences_small_drifts():
    drift_KxT = _noisy(32, 4) * _fault(np.asarray(_clean()[0]), 0.02)
    ref_G = _reference_G()
    assert np.asarray(_alerts(drift_KxT, ref_G)).any(axis=1).all()
    assert not np.any(np.asarray(_alerts(drift_KxT, ref_G, dataclasses.replace(CFG, residual_floor=0.01))))


def test_state_is_small_and_fixed():
    state = monitor.monitor_init(CFG)
    new = jax.jit(monitor.monitor_update)(state, jnp.float32(2.5), jnp.float32(0.5))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), new) == jax.tree.map(lambda x: (x.shape, x.dtype), state)
    assert float(new["loss_sum"][CFG.n_bins // 2]) == 2.5 and float(new["count"].sum()) == 1.0
