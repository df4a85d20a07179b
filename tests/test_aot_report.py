"""The compile report as text, and what `celerity compile` checks before compiling."""

import pytest

from celerity_jax.aot.compile import StepSetting
from celerity_jax.aot.report import check_writable, format_report, nothing_fits
from celerity_jax.aot.row import Row
from celerity_jax.errors import ConfigError

REPORT = {"mesh_shape": [1, 4, 1], "microbatches": 11, "remat": "none", "scan_layers": True,
          "compute_dtype": "bfloat16", "residual_dtype": "bfloat16", "attention_impl": "flash", "dense_backward": "plain",
          "logits_chunk_len": 128,
          "seq_len": 8192, "unsplit": [], "batch_seqs": 176, "steps": 3755, "bytes_per_chip": 26.6e9,
          "usable_bytes_per_chip": 102e9, "fits": True, "headroom": 0.74, "compile_seconds": 29.4, "error": None,
          "model_flops_per_step": 1.0e16, "xla_flops_per_step": 0.72e16, "est_step_seconds": 2.126,
          "est_tokens_per_sec": 678241.0, "est_mfu": 0.902, "est_days": 0.09, "est_chip_hours": 9.0,
          "estimate_note": "est_* values are estimates", "gin_params": ["TrainConfig.microbatches = 11"]}


def test_a_report_that_fits_ends_with_its_gin_line():
    lines = format_report(REPORT).splitlines()
    assert lines[0] == ("setting   mesh (data, fsdp, tensor) (1, 4, 1), 11 microbatches, remat none, scan_layers True, "
                        "bfloat16 (residual bfloat16), attention flash, loss in chunks of 128 positions")
    assert lines[1] == "memory    26.6 GB per chip of 102.0 GB usable: fits, 74% headroom"
    assert lines[3].startswith("estimate* 2.126 s/step, 678,241 tokens/s, MFU 90.2%; the plan's 3,755 steps")
    assert lines[-1] == 'gin       --gin-param "TrainConfig.microbatches = 11"'


def test_the_setting_line_states_the_dims_kept_whole():
    report = dict(REPORT, unsplit=["embed dim 0 (257) over tensor (4)"], logits_chunk_len=8192)
    assert format_report(report).splitlines()[0].endswith(
        "whole logits; kept whole, the mesh axis does not divide them: embed dim 0 (257) over tensor (4)")


def test_a_report_that_does_not_fit_names_the_fix():
    report = dict(REPORT, fits=False, error="RESOURCE_EXHAUSTED: out of memory", est_step_seconds=None)
    text = format_report(report)
    assert "DOES NOT FIT (RESOURCE_EXHAUSTED: out of memory)" in text and "estimate*" not in text
    assert text.splitlines()[-1].startswith("fix       raise TrainConfig.microbatches (now 11; at most 44")
    assert format_report({"error": "no mesh"}) == "nothing fits: no mesh"


def test_nothing_fits_says_why():
    setting = StepSetting((4, 1, 1), 1, "none", True)
    skipped = [Row(setting, skipped="a batch of 6 sequences does not split over 4 data shards")]
    assert "choose a slice whose chip count divides the batch" in nothing_fits(skipped)
    assert "try a larger slice" in nothing_fits([Row(setting)])


def test_an_unwritable_directory_is_refused(tmp_path):
    check_writable(str(tmp_path / "new"), "--cache-dir")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="--cache-dir: cannot create"):
        check_writable(str(tmp_path / "file" / "sub"), "--cache-dir")


def test_a_best_so_far_that_only_the_model_sized_says_so_with_its_gin_line():
    row = {"mesh_shape": [1, 4, 1], "microbatches": 2, "remat": "none", "scan_layers": True, "fits": None,
           "by_model": "fits", "model_bytes": 2.5e9, "bytes_per_chip": None, "est_step_seconds": 0.25,
           "est_mfu": 0.5, "estimate_note": "estimates"}
    text = format_report(row)
    assert "2.5 GB per chip by the footprint model" in text and "celerity compile" in text
    assert 'gin       --gin-param "TrainConfig.mesh_shape = (1, 4, 1)"' in text and "0.250 s/step" in text
