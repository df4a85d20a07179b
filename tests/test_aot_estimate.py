"""XLA's step-time and FLOP estimates of a compiled train step, assembled from loop-free pieces."""

import dataclasses

import pytest

from celerity_jax import recipe
from celerity_jax.aot import estimate
from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import StepSetting, apply_setting, compile_report, slice_devices
from celerity_jax.model.sharding import make_mesh


@pytest.mark.slow  # 17 s
def test_loop_correction_counts_every_microbatch(tiny_configs, tpu_slice):
    configs = tiny_configs("RecipeConfig.batch_seqs = 16")
    one = compile_report(configs, tpu_slice, StepSetting((1, 4, 1), 1, "none", False))
    four = compile_report(configs, tpu_slice, StepSetting((1, 4, 1), 4, "none", True))
    assert four["xla_flops_per_step"] == pytest.approx(one["xla_flops_per_step"], rel=0.03)
    assert four["est_step_seconds"] > 0


@pytest.mark.slow  # 17 s
def test_corrected_flops_match_the_analytic_model_flops(tiny_configs, tpu_slice):
    # Analytic FLOPs count the input embedding as a matmul (6·V·D per token); XLA does a lookup there.
    configs = tiny_configs("ModelConfig.vocab_size = 4096", "ModelConfig.d_model = 128", "ModelConfig.n_heads = 2",
                           "ModelConfig.head_dim = 64")
    report = compile_report(configs, tpu_slice, StepSetting((1, 4, 1), 2, "none", False))
    plan = recipe.make_plan(configs.model, configs.recipe)
    lookup = 6 * configs.model.vocab_size * configs.model.d_model * plan.batch_tokens
    assert report["xla_flops_per_step"] == pytest.approx(report["model_flops_per_step"] - lookup, rel=0.05)


def test_gradient_cost_extrapolated_from_two_layers_matches_a_direct_compile(tiny_configs, tpu_slice):
    configs = apply_setting(tiny_configs("ModelConfig.n_layers = 4"), StepSetting((1, 4, 1), 1, "none", False), "tpu")
    _, devices = slice_devices(tpu_slice)
    mesh = make_mesh((1, 4, 1), devices=devices)
    extrapolated = estimate.gradient_cost(configs.model, 4, 64, mesh, 0.0, Cache(None), tpu_slice)
    direct = estimate.costs(estimate._lower_gradient(configs.model, 4, 64, mesh, 0.0).compile())
    assert extrapolated["flops"] == pytest.approx(direct["flops"], rel=0.01)
    assert extrapolated["optimal_seconds"] == pytest.approx(direct["optimal_seconds"], rel=0.1)


def test_an_fsdp_mesh_counts_the_flops_of_an_all_data_mesh(tiny_configs):
    # At this shape XLA:TPU turns the fsdp mesh's gathered matmuls into windowed-einsum loops, whose cost analysis
    # counts one trip (a quarter of the FLOPs went missing); the estimate's pieces compile without them.
    pytest.importorskip("libtpu", reason="libtpu (extra 'tpu', installed by `make test`) is absent")
    configs = apply_setting(tiny_configs("ModelConfig.d_model = 512", "ModelConfig.n_heads = 32",
                                         "ModelConfig.vocab_size = 512", "ModelConfig.max_seq_len = 512"),
                            StepSetting((1, 16, 1), 1, "none", False), "tpu")
    model = dataclasses.replace(configs.model, n_layers=1)
    _, devices = slice_devices("v5p-32")
    fsdp, data = (make_mesh(shape, devices=devices) for shape in ((1, 16, 1), (16, 1, 1)))
    assert "windowed_dot_general" in estimate._lower_gradient(model, 16, 512, fsdp, 0.0).compile().as_text()
    cost = lambda mesh: estimate.gradient_piece(model, 16, 512, mesh, 0.0, Cache(None), "v5p-32", 1, 1)  # noqa: E731
    assert cost(fsdp)["flops"] == pytest.approx(cost(data)["flops"], rel=0.01)


# 16 and 8 chunks of 256 positions (slow), and an odd count: 3 chunks of 8 in 24
@pytest.mark.parametrize("chunk_len", [pytest.param(16, marks=pytest.mark.slow),
                                       pytest.param(32, marks=pytest.mark.slow), 8])
def test_the_estimate_counts_every_chunk_of_a_chunked_loss(chunk_len, tiny_configs, tpu_slice):
    configs = tiny_configs("ModelConfig.vocab_size = 4096", "ModelConfig.max_seq_len = 256")
    configs = apply_setting(configs, StepSetting((1, 4, 1), 1, "none", False), "tpu")
    _, devices = slice_devices(tpu_slice)
    mesh = make_mesh((1, 4, 1), devices=devices)
    seq_len = 24 if chunk_len == 8 else 256
    cost = lambda chunk: estimate.gradient_cost(  # noqa: E731
        dataclasses.replace(configs.model, logits_chunk_len=chunk), 4, seq_len, mesh, 1e-4, Cache(None), tpu_slice)
    chunked, whole = cost(chunk_len), cost(0)
    assert chunked["flops"] == pytest.approx(whole["flops"], rel=0.02)  # the same matmuls, in chunks


def test_xla_minus_one_second_per_concat_bitcast_is_added_back(tiny_configs, tpu_slice):
    configs = apply_setting(tiny_configs("ModelConfig.vocab_size = 32768", "ModelConfig.max_seq_len = 1024",
                                         "ModelConfig.n_layers = 1"), StepSetting((4, 1, 1), 1, "none", False), "tpu")
    _, devices = slice_devices(tpu_slice)
    compiled = estimate._lower_gradient(configs.model, 4, 1024, make_mesh((4, 1, 1), devices=devices), 0.0).compile()
    raw = compiled.cost_analysis()["optimal_seconds"]
    calls = compiled.as_text().count('custom_call_target="ConcatBitcast"')
    assert raw < 0 and calls >= 1  # as XLA:TPU (libtpu 0.0.42) reports this program
    assert estimate.costs(compiled)["optimal_seconds"] == pytest.approx(raw + calls) and raw + calls > 0
