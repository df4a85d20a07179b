"""`celerity compile` for a TPU slice on this CPU host (libtpu compiles without a TPU), at tiny shapes."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from celerity_jax import gin_config, recipe
from celerity_jax.aot import estimate, memory, search
from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import Setting, apply_setting, compile_report, slice_devices
from celerity_jax.aot.memory import compile_train_step
from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig
from celerity_jax.sharding import make_mesh
from celerity_jax.train import loop, setup, step as step_lib

pytest.importorskip("libtpu", reason="libtpu (extra 'tpu', installed by `make test`) is absent")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIN = [os.path.join(ROOT, "experiments/tiny/d48.gin"), os.path.join(ROOT, "tests/configs/smoke.gin")]
SLICE = "v5e-4"
REPORT_KEYS = {"hbm_bytes_per_chip", "bytes_per_chip", "fits", "headroom", "mesh_shape", "microbatches", "remat",
               "scan_layers", "compute_dtype", "attention_impl", "est_step_seconds", "est_tokens_per_sec", "est_mfu",
               "est_days", "est_chip_hours", "compile_seconds"}
# Larger than a v5e chip's 16 GiB: whole float32 logits of 64 × 8192 tokens over a 128k vocabulary.
TOO_BIG = ["ModelConfig.vocab_size = 128256", "ModelConfig.max_seq_len = 8192", "RecipeConfig.seq_len = 8192",
           "RecipeConfig.batch_seqs = 64", "ModelConfig.logits_chunk_len = 0"]


def _configs(*params):
    return gin_config.parse_gin(GIN, list(params))


def test_tiny_step_compiles_for_a_tpu_slice_and_reports_numbers():
    report = compile_report(_configs(), SLICE, Setting((1, 4, 1), 2, "none", False))
    assert REPORT_KEYS <= set(report)
    assert report["fits"] and report["error"] is None and 0.9 < report["headroom"] < 1
    assert 0 < report["bytes_per_chip"] < report["hbm_bytes_per_chip"]
    assert report["est_step_seconds"] > 0 and report["est_tokens_per_sec"] > 0 and 0 < report["est_mfu"] < 1
    assert report["est_chip_hours"] == pytest.approx(4 * report["steps"] * report["est_step_seconds"] / 3600)
    json.dumps(report)


def test_auto_resolves_for_the_target_not_the_host():
    assert ModelConfig().for_platform("tpu").compute_dtype == "bfloat16"
    assert ModelConfig().for_platform("cpu").attention_impl == "blocked"
    assert ModelConfig(attention_impl="xla").for_platform("cpu").attention_impl == "xla"
    assert ModelConfig().for_platform("gpu").attention_impl == "flash"
    assert ModelConfig().for_platform("cuda").compute_dtype == "bfloat16"
    report = compile_report(_configs(), SLICE, Setting((4, 1, 1), 1, "none", False))
    assert (report["compute_dtype"], report["attention_impl"], report["dense_backward"]) == ("bfloat16", "flash",
                                                                                            "plain")


@pytest.mark.slow  # 17 s
def test_loop_correction_counts_every_microbatch():
    configs = _configs("RecipeConfig.batch_seqs = 16")
    one = compile_report(configs, SLICE, Setting((1, 4, 1), 1, "none", False))
    four = compile_report(configs, SLICE, Setting((1, 4, 1), 4, "none", True))
    assert four["xla_flops_per_step"] == pytest.approx(one["xla_flops_per_step"], rel=0.03)
    assert four["est_step_seconds"] > 0


@pytest.mark.slow  # 17 s
def test_corrected_flops_match_the_analytic_model_flops():
    # Analytic FLOPs count the input embedding as a matmul (6·V·D per token); XLA does a lookup there.
    configs = _configs("ModelConfig.vocab_size = 4096", "ModelConfig.d_model = 128", "ModelConfig.n_heads = 2",
                        "ModelConfig.head_dim = 64")
    report = compile_report(configs, SLICE, Setting((1, 4, 1), 2, "none", False))
    plan = recipe.make_plan(configs.model, configs.recipe)
    lookup = 6 * configs.model.vocab_size * configs.model.d_model * plan.batch_tokens
    assert report["xla_flops_per_step"] == pytest.approx(report["model_flops_per_step"] - lookup, rel=0.05)


def test_gradient_cost_extrapolated_from_two_layers_matches_a_direct_compile():
    configs = apply_setting(_configs("ModelConfig.n_layers = 4"), Setting((1, 4, 1), 1, "none", False), "tpu")
    _, devices = slice_devices(SLICE)
    mesh = make_mesh((1, 4, 1), devices=devices)
    extrapolated = estimate.gradient_cost(configs.model, 4, 64, mesh, 0.0, Cache(None), SLICE)
    direct = estimate.costs(estimate._lower_gradient(configs.model, 4, 64, mesh, 0.0).compile())
    assert extrapolated["flops"] == pytest.approx(direct["flops"], rel=0.01)
    assert extrapolated["optimal_seconds"] == pytest.approx(direct["optimal_seconds"], rel=0.1)


# 16 and 8 chunks of 256 positions (slow), and an odd count: 3 chunks of 8 in 24
@pytest.mark.parametrize("chunk_len", [pytest.param(16, marks=pytest.mark.slow),
                                       pytest.param(32, marks=pytest.mark.slow), 8])
def test_the_estimate_counts_every_chunk_of_a_chunked_loss(chunk_len):
    configs = _configs("ModelConfig.vocab_size = 4096", "ModelConfig.max_seq_len = 256")
    configs = apply_setting(configs, Setting((1, 4, 1), 1, "none", False), "tpu")
    _, devices = slice_devices(SLICE)
    mesh = make_mesh((1, 4, 1), devices=devices)
    seq_len = 24 if chunk_len == 8 else 256
    cost = lambda chunk: estimate.gradient_cost(  # noqa: E731
        dataclasses.replace(configs.model, logits_chunk_len=chunk), 4, seq_len, mesh, 1e-4, Cache(None), SLICE)
    chunked, whole = cost(chunk_len), cost(0)
    assert chunked["flops"] == pytest.approx(whole["flops"], rel=0.02)  # the same matmuls, in chunks


def test_a_step_that_cannot_fit_is_reported_not_raised():
    report = compile_report(_configs(*TOO_BIG), SLICE, Setting((4, 1, 1), 1, "none", True))
    assert not report["fits"] and "RESOURCE_EXHAUSTED" in report["error"]
    assert report["bytes_per_chip"] > report["hbm_bytes_per_chip"]
    assert report["est_step_seconds"] is None


@pytest.mark.slow  # 40 s
def test_search_returns_a_setting_that_fits_and_what_it_tried(tmp_path):
    best, tried = search.search(_configs(), SLICE, cache=Cache(str(tmp_path)), log=lambda _: None)
    assert search.usable(best) and best in tried
    fastest = min(r["est_step_seconds"] for r in tried if search.usable(r))
    assert best["est_step_seconds"] <= (1 + search.SAME_ESTIMATE) * fastest
    assert {tuple(r["mesh_shape"]) for r in tried} >= {(1, 4, 1), (4, 1, 1)}
    assert {r["scan_layers"] for r in tried} == {True, False}
    cached = os.listdir(tmp_path)
    again, _ = search.search(_configs(), SLICE, cache=Cache(str(tmp_path)), log=lambda _: None)
    assert again == best and os.listdir(tmp_path) == cached  # every compile came from the cache


def test_candidate_meshes_and_microbatch_sizes():
    assert search.candidate_meshes(8, 10) == [(1, 8, 1), (8, 1, 1), (1, 4, 2)]
    assert search.candidate_meshes(16, 16) == [(1, 16, 1), (16, 1, 1), (1, 8, 2), (1, 4, 4)]
    assert search.microbatch_seqs(44) == [1, 2, 4, 44]
    assert search.microbatch_seqs(1) == [1]


def test_search_skips_meshes_the_batch_does_not_split_over():
    best, tried = search.search(_configs("RecipeConfig.batch_seqs = 6"), SLICE, log=lambda _: None)
    assert best is None and all("does not split over 4 data shards" in r["skipped"] for r in tried)


def test_cli_names_the_fix_when_no_mesh_splits_the_batch(tmp_path):
    out = _cli("--gin-file", GIN[0], "--gin-file", GIN[1], "--gin-param", "RecipeConfig.batch_seqs = 6",
               "--topology", SLICE, "--search", "--cache-dir", str(tmp_path))
    assert out.returncode == 1 and "RecipeConfig.batch_seqs" in out.stdout


def test_cudnn_attention_is_refused_for_a_tpu():
    with pytest.raises(ConfigError, match="attention_impl='cudnn' runs on NVIDIA GPUs only"):
        compile_report(_configs("ModelConfig.attention_impl = 'cudnn'", "ModelConfig.compute_dtype = 'bfloat16'"),
                       SLICE, Setting((4, 1, 1), 1, "none", False))


@pytest.mark.parametrize("message, gib", [
    ("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 49.34G of 32.00G hbm.", 49.34),
    ("RESOURCE_EXHAUSTED: the total memory required for HLO temporaries (1.66T) exceeds available HBM (95.74G).",
     1.66 * 1024),
    ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:", 0.0),
])
def test_out_of_memory_messages_give_the_bytes_xla_names(message, gib):
    assert memory._required_bytes(message) == pytest.approx(gib * 2**30)


def test_train_refuses_a_step_that_does_not_fit(tmp_path):
    configs = _configs(*TOO_BIG)
    _, devices = slice_devices(SLICE)
    run = apply_setting(configs, Setting((4, 1, 1), 1, "none", True), "tpu")
    plan = recipe.make_plan(run.model, run.recipe)
    mesh = make_mesh((4, 1, 1), devices=devices)
    build = step_lib.build_step(run.model, plan, run.monitor, mesh, microbatches=1, z_loss=0.0, seed=0)
    with pytest.raises(ConfigError, match="does not fit.*TrainConfig.microbatches.*remat = 'dots'.*celerity compile"):
        compile_train_step(build, plan, run.train, run.model)


def test_train_refuses_before_writing_anything(tmp_path, monkeypatch):
    def refuse(*_):
        raise ConfigError("the train step does not fit")
    monkeypatch.setattr(setup, "compile_train_step", refuse)
    with pytest.raises(ConfigError, match="does not fit"):
        loop.train(_configs(), str(tmp_path / "run"), log=lambda _: None)
    assert not os.path.exists(tmp_path / "run")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "celerity_jax.cli", "compile", *args], cwd=ROOT,
                          capture_output=True, text=True)


@pytest.mark.slow  # 13 s
def test_cli_prints_json_with_every_key(tmp_path):
    out = _cli("--gin-file", GIN[0], "--gin-file", GIN[1], "--topology", SLICE, "--json", "--cache-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert REPORT_KEYS <= set(report) and report["fits"]
    assert "TPU" not in out.stderr  # no libtpu start-up noise


def test_cli_bad_topology_is_one_line():
    out = _cli("--gin-file", GIN[0], "--topology", "v5p-7")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "v5p-8" in out.stderr


def test_setting_gin_params_parse_back():
    setting = Setting((2, 2, 1), 4, "dots", True)
    assert Setting.of(_configs(*setting.gin_params())) == setting


def test_a_mesh_with_minus_one_is_reported_resolved():
    report = compile_report(_configs("TrainConfig.mesh_shape = (-1, 1, 1)"), SLICE)
    assert report["mesh_shape"] == [4, 1, 1] and "TrainConfig.mesh_shape = (4, 1, 1)" in report["gin_params"]


def test_cli_refuses_an_unwritable_json_path_before_compiling(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = _cli("--gin-file", GIN[0], "--topology", SLICE, "--json", str(blocker / "out.json"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--json" in out.stderr


def test_tiny_step_compiles_for_a_gpu_slice_memory_only():
    pytest.importorskip("jax_plugins.xla_cuda12", reason="the CUDA PJRT plugin (extra 'cuda-compile') is absent")
    report = compile_report(_configs(), "h200-8", Setting((8, 1, 1), 1, "none", False))
    assert report["fits"] and 0 < report["bytes_per_chip"] < report["hbm_bytes_per_chip"]
    assert report["compute_dtype"] == "bfloat16" and report["est_step_seconds"] is None
    assert "no cost analysis" in report["estimate_note"]


def test_xla_minus_one_second_per_concat_bitcast_is_added_back():
    configs = apply_setting(_configs("ModelConfig.vocab_size = 32768", "ModelConfig.max_seq_len = 1024",
                                     "ModelConfig.n_layers = 1"), Setting((4, 1, 1), 1, "none", False), "tpu")
    _, devices = slice_devices(SLICE)
    compiled = estimate._lower_gradient(configs.model, 4, 1024, make_mesh((4, 1, 1), devices=devices), 0.0).compile()
    raw = compiled.cost_analysis()["optimal_seconds"]
    calls = compiled.as_text().count('custom_call_target="ConcatBitcast"')
    assert raw < 0 and calls >= 1  # as XLA:TPU (libtpu 0.0.42) reports this program
    assert estimate.costs(compiled)["optimal_seconds"] == pytest.approx(raw + calls) and raw + calls > 0


def test_cli_reports_a_step_that_does_not_fit_with_the_fix(tmp_path):
    params = [arg for p in TOO_BIG for arg in ("--gin-param", p)]
    out = _cli("--gin-file", GIN[0], "--gin-file", GIN[1], *params, "--topology", SLICE, "--cache-dir", str(tmp_path))
    assert out.returncode == 1 and "DOES NOT FIT" in out.stdout
    assert "fix       raise TrainConfig.microbatches (now 1; at most 16" in out.stdout
