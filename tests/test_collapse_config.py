import dataclasses

import pytest

from celerity_jax.collapse.config import CurveGrid, MonitorConfig, replay_config
from celerity_jax.errors import ConfigError


@pytest.mark.parametrize("field, value", [("n_bins", 1), ("smooth_bins", 4), ("align_window", (0.5, 0.2)),
                                          ("min_align_span", 0.5), ("alert_m", 0), ("offset", -1.0)])
def test_config_is_validated(field, value):
    with pytest.raises(ConfigError, match="MonitorConfig"):
        MonitorConfig(**{field: value})


def test_the_first_failing_check_is_reported():
    with pytest.raises(ConfigError, match=r"^MonitorConfig: smooth_bins must be odd.*\(got MonitorConfig\("):
        MonitorConfig(smooth_bins=4, offset=-1.0, alert_k=0.0)
    with pytest.raises(ConfigError, match="^MonitorConfig: align_window must be"):
        MonitorConfig(align_window=(0.5, 0.2), offset=-1.0)


def test_monitor_config_fields_are_a_run_identity():
    """dataclasses.asdict(MonitorConfig) is stored in run.json: its keys, order and defaults stay (a key added
    later is compared at its default with older run directories: rundir.identity.Identity.same_run)."""
    assert dataclasses.asdict(MonitorConfig()) == {
        "n_bins": 1000, "smooth_bins": 11, "align_window": (0.25, 0.5), "min_align_span": 0.05, "offset": 0.0,
        "alert_k": 4.0, "alert_m": 10, "residual_floor": 0.0, "stop_on_alert": False, "loss_curve": "train"}
    assert list(dataclasses.asdict(MonitorConfig())) == ["n_bins", "smooth_bins", "align_window", "min_align_span",
                                                          "offset", "alert_k", "alert_m", "residual_floor",
                                                          "stop_on_alert", "loss_curve"]
    assert MonitorConfig(align_window=[0.1, 0.4]).align_window == (0.1, 0.4)  # gin gives lists


def test_grid_of_a_monitor_config_and_its_checks():
    cfg = MonitorConfig(n_bins=200, smooth_bins=5, offset=1.5, alert_k=3.0)
    assert cfg.grid == CurveGrid(200, 5, 1.5)
    assert CurveGrid() == MonitorConfig().grid
    for fields, problem in [({"n_bins": 1}, "n_bins must be >= 2"), ({"smooth_bins": 2}, "smooth_bins must be odd"),
                            ({"n_bins": 10, "smooth_bins": 11}, "smooth_bins must be odd, >= 1 and < n_bins"),
                            ({"offset": -0.1}, "offset must be >= 0")]:
        with pytest.raises(ConfigError, match=f"^CurveGrid: {problem}"):
            CurveGrid(**fields)
    with pytest.raises(ConfigError, match=r"CurveGrid.n_bins=2.5 must be an int"):
        CurveGrid(n_bins=2.5)


def test_replay_config_is_the_default_policy_on_a_grid():
    cfg = replay_config(CurveGrid(200, 5, 0.5), (0.25, 0.5))
    assert cfg == MonitorConfig(n_bins=200, smooth_bins=5, offset=0.5)
    assert replay_config(CurveGrid(), (0.1, 0.12)).min_align_span == pytest.approx(0.02)
