"""Compiling a run's train step for a TPU slice on this CPU host (libtpu compiles without a TPU), at tiny shapes:
the report, its setting and its fit."""

import json

import pytest

from celerity_jax import accelerators
from celerity_jax.aot import calibration
from celerity_jax.aot.compile import StepSetting, compile_report
from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig


def test_tiny_step_compiles_for_a_tpu_slice_and_reports_numbers(tiny_configs, tpu_slice, report_keys):
    report = compile_report(tiny_configs(), tpu_slice, StepSetting((1, 4, 1), 2, "none", False))
    assert report_keys <= set(report) and report["unsplit"] == []
    assert report["fits"] and report["error"] is None and 0.9 < report["headroom"] < 1
    assert 0 < report["bytes_per_chip"] < report["hbm_bytes_per_chip"]
    assert report["est_step_seconds"] > 0 and report["est_tokens_per_sec"] > 0 and 0 < report["est_mfu"] < 1
    assert report["est_chip_hours"] == pytest.approx(4 * report["steps"] * report["est_step_seconds"] / 3600)
    json.dumps(report)


def test_auto_resolves_for_the_target_not_the_host(tiny_configs, tpu_slice):
    assert ModelConfig().for_platform("tpu").compute_dtype == "bfloat16"
    assert ModelConfig().for_platform("cpu").attention_impl == "blocked"
    assert ModelConfig(attention_impl="xla").for_platform("cpu").attention_impl == "xla"
    assert ModelConfig().for_platform("gpu").attention_impl == "flash"
    assert ModelConfig().for_platform("cuda").compute_dtype == "bfloat16"
    report = compile_report(tiny_configs(), tpu_slice, StepSetting((4, 1, 1), 1, "none", False))
    assert (report["compute_dtype"], report["attention_impl"], report["dense_backward"]) == ("bfloat16", "flash",
                                                                                            "plain")


def test_a_step_that_cannot_fit_is_reported_not_raised(tiny_configs, tpu_slice, too_big):
    report = compile_report(tiny_configs(*too_big), tpu_slice, StepSetting((4, 1, 1), 1, "none", True))
    assert not report["fits"] and "RESOURCE_EXHAUSTED" in report["error"]
    assert report["bytes_per_chip"] > report["hbm_bytes_per_chip"]
    assert report["est_step_seconds"] is None


def test_estimate_always_estimates_a_step_that_does_not_fit_and_calibrates_it(tiny_configs, tpu_slice, monkeypatch):
    monkeypatch.setattr(accelerators, "usable_bytes", lambda chip: 1)  # nothing fits
    points = [{"chip": "v5e", "ratio": 0.9, "est_mfu": 0.5}, {"chip": "v5e", "ratio": 1.0, "est_mfu": 0.6}]
    monkeypatch.setattr(calibration, "load", lambda: {"points": points, "fit": calibration.fit(points)})
    setting = StepSetting((1, 4, 1), 2, "none", False)
    assert compile_report(tiny_configs(), tpu_slice, setting)["est_step_seconds"] is None
    report = compile_report(tiny_configs(), tpu_slice, setting, estimates="always")
    assert not report["fits"] and report["est_step_seconds"] > 0
    cal = report["calibrated"]
    assert cal["ratio"] == pytest.approx(calibration.ratio(report["chip"], calibration.load()["fit"]))
    assert cal["step_seconds"] == pytest.approx(report["est_step_seconds"] / cal["ratio"])


def test_cudnn_attention_is_refused_for_a_tpu(tiny_configs, tpu_slice):
    with pytest.raises(ConfigError, match="attention_impl='cudnn' runs on NVIDIA GPUs only"):
        compile_report(tiny_configs("ModelConfig.attention_impl = 'cudnn'", "ModelConfig.compute_dtype = 'bfloat16'"),
                       tpu_slice, StepSetting((4, 1, 1), 1, "none", False))


def test_step_setting_gin_params_parse_back(tiny_configs):
    setting = StepSetting((2, 2, 1), 4, "dots", True)
    assert StepSetting.of(tiny_configs(*setting.gin_params())) == setting


def test_a_mesh_with_minus_one_is_reported_resolved(tiny_configs, tpu_slice):
    report = compile_report(tiny_configs("TrainConfig.mesh_shape = (-1, 1, 1)"), tpu_slice)
    assert report["mesh_shape"] == [4, 1, 1] and "TrainConfig.mesh_shape = (4, 1, 1)" in report["gin_params"]


def test_tiny_step_compiles_for_a_gpu_slice_memory_only(tiny_configs):
    pytest.importorskip("jax_plugins.xla_cuda12", reason="the CUDA PJRT plugin (extra 'cuda-compile') is absent")
    report = compile_report(tiny_configs(), "h200-8", StepSetting((8, 1, 1), 1, "none", False))
    assert report["fits"] and 0 < report["bytes_per_chip"] < report["hbm_bytes_per_chip"]
    assert report["compute_dtype"] == "bfloat16" and report["est_step_seconds"] is None
    assert "no cost analysis" in report["estimate_note"]
