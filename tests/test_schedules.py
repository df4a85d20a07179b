import jax
import numpy as np
import pytest

from celerity_jax import schedules
from celerity_jax.errors import ConfigError

FRAC = np.linspace(0.0, 1.0, 1001)


def test_d2z_warmup_then_linear_to_zero():
    s = schedules.make_schedule("d2z", total_steps=100, warmup_steps=10)
    values = np.asarray(s(np.arange(101)))
    np.testing.assert_allclose(values[[0, 5, 10, 55, 100]], [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
    assert np.all(np.diff(values[:11]) > 0) and np.all(np.diff(values[10:]) < 0)


@pytest.mark.parametrize("name, end", [("d2z", 0.0), ("constant", 1.0), ("cosine", 0.0),
                                       ("linear_10x", 0.1), ("wsd", 0.0)])
def test_normalized_peak_one_and_end_value(name, end):
    values = np.asarray(schedules.normalized(name, FRAC, warmup_frac=0.1))
    assert values.max() == pytest.approx(1.0, abs=1e-6)
    assert values[100] == pytest.approx(1.0, abs=1e-6)  # t̂ = warmup_frac is the peak
    assert values[50] == pytest.approx(0.5, abs=1e-6)  # halfway through the linear warmup
    assert values[-1] == pytest.approx(end, abs=1e-6)


def test_decay_shapes_midway():
    mid = 0.1 + 0.9 / 2  # halfway through the decay phase after a 10% warmup
    value = lambda name: float(schedules.normalized(name, mid, warmup_frac=0.1))
    assert value("d2z") == pytest.approx(0.5, abs=1e-6)
    assert value("cosine") == pytest.approx(0.5, abs=1e-6)
    assert value("linear_10x") == pytest.approx(0.55, abs=1e-6)
    assert value("wsd") == 1.0  # still stable: only the last 20% decays
    assert float(schedules.normalized("wsd", 0.9, 0.1, wsd_decay_frac=0.2)) == pytest.approx(0.5)


def test_step_schedule_is_normalized_at_step_over_total():
    s = schedules.make_schedule("cosine", total_steps=400, warmup_steps=40)
    steps = np.arange(0, 400, 7)
    np.testing.assert_allclose(s(steps), schedules.normalized("cosine", steps / 400, 0.1), atol=1e-6)
    assert float(jax.jit(s)(200)) == pytest.approx(float(s(200)))


@pytest.mark.parametrize("kwargs, field", [
    (dict(name="linear", warmup_frac=0.1), "schedule"),
    (dict(name="d2z", warmup_frac=1.0), "warmup_frac"),
    (dict(name="wsd", warmup_frac=0.5, wsd_decay_frac=0.6), "wsd_decay_frac"),
])
def test_bad_schedules_raise_config_error(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        schedules.check_schedule(**kwargs)


def test_warmup_longer_than_training_raises():
    with pytest.raises(ConfigError, match="warmup_frac"):
        schedules.make_schedule("d2z", total_steps=10, warmup_steps=12)


def _simulate_decay_recurrence(lr_T, weight_decay, theta0, x_T):
    theta = theta0
    for lr, x in zip(lr_T, x_T):
        theta = (1 - lr * weight_decay) * theta + lr * weight_decay * x
    return theta


@pytest.mark.parametrize("name", schedules.SCHEDULES)
def test_ema_coefficients_reproduce_adamw_recurrence(name):
    lr_T = 0.05 * np.asarray(schedules.make_schedule(name, 200, 20)(np.arange(200)), np.float64)
    weight_decay = 0.3
    c_T = np.asarray(schedules.ema_coefficients(lr_T, weight_decay))
    init_weight = np.prod(1 - lr_T * weight_decay)
    assert c_T.sum() + init_weight == pytest.approx(1.0, abs=1e-5)
    x_T = np.random.default_rng(0).normal(size=200)
    expected = _simulate_decay_recurrence(lr_T, weight_decay, 2.0, x_T)
    assert init_weight * 2.0 + c_T @ x_T == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_ema_coefficients_at_intermediate_step_and_d2z_flattening():
    lr_T = 0.1 * np.asarray(schedules.make_schedule("d2z", 100, 0)(np.arange(100)))
    c_T = np.asarray(schedules.ema_coefficients(lr_T, 0.5, t=39))
    assert np.all(c_T[40:] == 0) and c_T[39] == pytest.approx(lr_T[39] * 0.5, rel=1e-6)
    const_T = np.full(100, 0.1)
    c_d2z = np.asarray(schedules.ema_coefficients(lr_T, 0.5))
    c_const = np.asarray(schedules.ema_coefficients(const_T, 0.5))
    # Decaying to zero spreads the final weights over more updates (Straight to Zero, Fig. 1).
    assert c_d2z.max() < 0.5 * c_const.max()
    assert 1 / np.sum(c_d2z**2) > 2 / np.sum(c_const**2)


def test_plot_ema_coefficients_writes_png(tmp_path):
    lr_T = 0.1 * np.asarray(schedules.make_schedule("d2z", 50, 5)(np.arange(50)))
    path = schedules.plot_ema_coefficients({"d2z": lr_T, "constant": np.full(50, 0.1)}, 0.2,
                                           str(tmp_path / "ema.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
