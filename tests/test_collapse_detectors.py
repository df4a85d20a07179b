import numpy as np
import pytest

from celerity_jax.collapse import curves, detectors
from celerity_jax.errors import ConfigError

CFG = detectors.ZScoreConfig()


def _noisy_curve(steps=1000, noise=0.03, seed=0):
    t_T = np.arange(1, steps + 1)
    rng = np.random.default_rng(seed)
    return (2.0 + 3.0 * t_T ** -0.5) * (1.0 + noise * rng.standard_normal(steps))


def test_the_smoothed_loss_is_the_loss_ema():
    loss_T = _noisy_curve(300)
    loss_T[[0, 57, 58]] = np.nan  # skipped steps leave the EMA unchanged
    got = np.asarray(detectors.zscore_detector(loss_T, CFG)["smooth"])
    expected = curves.loss_ema(loss_T, CFG.ema_decay)[0]
    assert np.isnan(got[0]) and np.isnan(expected[0])
    np.testing.assert_allclose(got[1:], expected[1:], rtol=1e-6)


def test_rolling_zscore_compares_with_the_previous_window_only():
    s_T = np.random.default_rng(1).standard_normal(40).cumsum()
    z_T = np.asarray(detectors.rolling_zscore(s_T, 8))
    assert np.all(np.isnan(z_T[:8]))
    for t in range(8, 40):
        past = s_T[t - 8:t]
        assert z_T[t] == pytest.approx((s_T[t] - past.mean()) / past.std(ddof=1), rel=1e-4, abs=1e-5)
    assert np.isnan(detectors.rolling_zscore(np.ones(20), 5)[10])  # no spread: no score


def test_sustained_needs_m_consecutive_steps():
    exceed = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1], bool)
    np.testing.assert_array_equal(detectors.sustained(exceed, 3), [0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1])
    assert detectors.first_true(detectors.sustained(exceed, 3)) == 5
    assert detectors.first_true(detectors.sustained(exceed, 5)) == -1


def test_quiet_on_clean_noisy_curves_and_fires_soon_after_a_jump():
    for seed in range(20):
        for noise in (0.03, 0.05):
            assert not np.any(detectors.zscore_detector(_noisy_curve(noise=noise, seed=seed), CFG)["alert"])
    for seed in range(5):  # a 15% jump at step 600 (a 10% one is missed about 1 time in 10)
        loss_T = _noisy_curve(seed=seed)
        loss_T[600:] *= 1.15
        onset = detectors.first_true(detectors.zscore_detector(loss_T, CFG)["alert"])
        assert 600 + CFG.m - 1 <= onset < 615, (seed, onset)


def test_a_slow_drift_is_seen_late_if_at_all():
    """A loss that slowly stops improving (a 3% excess growing linearly from step 600) does not look
    unusual against its own recent past until late: the raw detector's known weakness."""
    loss_T = _noisy_curve(seed=3)
    loss_T[600:] *= 1.0 + 0.03 * np.linspace(0.0, 1.0, 400)
    onset = detectors.first_true(detectors.zscore_detector(loss_T, CFG)["alert"])
    assert onset == -1 or onset > 800


@pytest.mark.parametrize("field, value", [("ema_decay", 1.0), ("window", 1), ("k", 0.0), ("m", 0)])
def test_bad_config_is_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        detectors.ZScoreConfig(**{field: value})
