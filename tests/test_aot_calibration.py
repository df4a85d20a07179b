"""The calibration of XLA's TPU estimates: the fit, its application to a report, and the report's line."""

import math

import pytest

from celerity_jax.aot import calibration
from celerity_jax.aot.report import calibrated_line, format_report
from celerity_jax.errors import ConfigError


POINTS = [{"chip": "v5p", "ratio": 0.6, "est_mfu": 1.2}, {"chip": "v5p", "ratio": 0.66, "est_mfu": 1.1},
          {"chip": "v5e", "ratio": 0.95, "est_mfu": 0.7}]


def test_the_fit_is_one_geometric_mean_ratio_per_chip_with_its_residuals():
    f = calibration.fit(POINTS)
    assert f["ratio_by_chip"] == {"v5e": pytest.approx(0.95), "v5p": pytest.approx(math.sqrt(0.6 * 0.66))}
    assert f["runs_by_chip"] == {"v5e": 1, "v5p": 2} and f["n"] == 3
    assert f["max_abs_log_residual"] == pytest.approx(math.log(0.66 / 0.6) / 2)
    assert f["rms_log_loo"] == pytest.approx(math.log(0.66 / 0.6))  # each v5p run predicted by the other
    assert f["est_mfu_range"] == [0.7, 1.2]
    assert calibration.ratio("v4", f) is None


def test_too_few_points_is_one_clear_error():
    with pytest.raises(ConfigError, match="at least 2 points"):
        calibration.fit(POINTS[:1])


def test_expected_scales_the_estimate_by_its_chips_ratio():
    data = {"points": POINTS, "fit": calibration.fit(POINTS)}
    report = {"chip": "v5e", "est_step_seconds": 2.0, "est_tokens_per_sec": 1000.0, "est_mfu": 0.9}
    cal = calibration.expected(report, data)
    assert cal["ratio"] == pytest.approx(0.95) and cal["mfu"] == pytest.approx(0.9 * 0.95)
    assert cal["step_seconds"] == pytest.approx(2.0 / 0.95) and not cal["extrapolated"]
    assert cal["ratio_lo"] < cal["ratio"] < cal["ratio_hi"]
    assert cal["basis"].startswith("XLA's estimate × 0.95, measured ÷ estimated of the 1 published v5e run (of 3")
    assert calibration.expected(dict(report, est_mfu=1.5), data)["extrapolated"]
    assert calibration.expected(dict(report, chip="v4"), data) is None
    assert calibration.expected(dict(report, est_step_seconds=None), data) is None
    assert calibration.expected(report, {"fit": None}) is None


def test_the_shipped_data_names_a_source_for_every_measurement_and_why_each_run_was_left_out():
    data = calibration.load()
    for m in data["measurements"]:
        assert m["source"] and m["config_source"] and m["gin"].endswith(".gin")
        assert "tokens_per_sec_per_chip" in m["published"] or "tflops_per_chip" in m["published"]
    for d in data["dropped"]:
        assert d["source"] and d["why"] and d["published"]
    assert len(data["points"]) == len(data["measurements"])
    if len(data["points"]) >= calibration.MIN_POINTS:
        assert data["fit"]["n"] == len(data["points"])
    else:
        assert data["fit"] is None


def test_the_report_carries_the_calibrated_line():
    cal = {"ratio": 0.6, "step_seconds": 3.5, "step_seconds_lo": 3.0, "step_seconds_hi": 4.2, "mfu": 0.55,
           "mfu_lo": 0.47, "mfu_hi": 0.62, "basis": "XLA's estimate × 0.60: ..."}
    line = calibrated_line(cal, steps=1000)
    assert line.startswith("expected  3.500 s/step (3.000–4.200), MFU 55% (47%–62%), 0.04 days: XLA's estimate")
    report = {"mesh_shape": [1, 4, 1], "microbatches": 1, "remat": "none", "scan_layers": True,
              "compute_dtype": "bfloat16", "residual_dtype": "bfloat16", "attention_impl": "flash",
              "logits_chunk_len": 8, "seq_len": 8,
              "unsplit": [], "batch_seqs": 4, "steps": 1000, "bytes_per_chip": 1e9, "usable_bytes_per_chip": 1e10,
              "fits": True, "headroom": 0.9, "compile_seconds": 1.0, "error": None, "model_flops_per_step": 1e12,
              "xla_flops_per_step": 1e12, "est_step_seconds": 2.1, "est_tokens_per_sec": 16.0, "est_mfu": 0.9,
              "est_days": 0.02, "est_chip_hours": 1.0, "estimate_note": "estimates", "gin_params": [],
              "calibrated": cal}
    lines = format_report(report).splitlines()
    assert lines[3].startswith("estimate* ") and lines[5] == line
