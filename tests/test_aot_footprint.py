"""The footprint model: a step's bytes per chip without compiling it, and against XLA's."""

import dataclasses

import jax
import pytest

from celerity_jax import recipe
from celerity_jax.aot import footprint
from celerity_jax.aot.compile import StepSetting, apply_setting, compile_report, slice_devices
from celerity_jax.model import sharding
from celerity_jax.model.config import REMATS
from celerity_jax.train import step as step_lib

# Two layers, but 8192-token sequences: the activations are what the model is about, and they must be far
# larger than the chip's on-chip memory, where XLA keeps small buffers out of HBM.
LONG = ["ModelConfig.d_model = 128", "ModelConfig.n_heads = 2", "ModelConfig.head_dim = 64",
        "ModelConfig.max_seq_len = 8192", "RecipeConfig.seq_len = 8192", "RecipeConfig.batch_seqs = 16",
        "RecipeConfig.tpp = 2000"]


def _model(configs, topology, setting: StepSetting) -> footprint.Footprint:
    return footprint.of_setting(configs, topology, setting)


def test_activations_grow_with_depth_and_microbatch_and_shrink_with_remat_and_shards(tiny_configs, tpu_slice):
    configs = tiny_configs(*LONG)
    one = {remat: _model(configs, tpu_slice, StepSetting((1, 4, 1), 1, remat, True)) for remat in REMATS}
    layers = [one[remat].layers for remat in REMATS]  # each policy keeps less than the one before it
    assert all(a > b for a, b in zip(layers, layers[1:])) and layers[-1] > 0
    working = [one[remat].working for remat in REMATS]  # and recomputes more of a layer
    assert all(a < b for a, b in zip(working, working[1:]))
    four = _model(configs, tpu_slice, StepSetting((1, 4, 1), 4, "none", True))
    assert four.layers == pytest.approx(one["none"].layers / 4, rel=0.01)
    assert four.gradients == 2 * one["none"].gradients  # the running sum beside the microbatch's own
    deeper = tiny_configs(*LONG, "ModelConfig.n_layers = 4")
    assert _model(deeper, tpu_slice, StepSetting((1, 4, 1), 1, "none", True)).layers == pytest.approx(
        2 * one["none"].layers, rel=0.01)
    # all data parallel: the same activations per chip, the state whole on every chip
    data = _model(configs, tpu_slice, StepSetting((4, 1, 1), 1, "none", True))
    assert data.layers == pytest.approx(one["none"].layers, rel=0.01) and data.state > 3 * one["none"].state
    # fsdp 2 x tensor 2: the activations split four ways too, the attention's head groups folded into the batch
    tensor = _model(configs, tpu_slice, StepSetting((1, 2, 2), 1, "none", True))
    assert tensor.layers == pytest.approx(one["none"].layers, rel=0.01)


def test_grouped_key_value_heads_keep_less_state_and_smaller_saved_keys_and_values(tiny_configs, tpu_slice):
    """With 1 key/value head for 2, k and v shrink by half: their kernels in the state, and the k and v that the
    `qkv` policy keeps, 2 × B × L × head_dim bfloat16 values less per layer (B × L split over 4 chips)."""
    mha, gqa = (_model(tiny_configs(*LONG, *extra), tpu_slice, StepSetting((1, 4, 1), 1, "qkv", True))
                for extra in ((), ("ModelConfig.n_kv_heads = 1",)))
    assert gqa.state < mha.state
    per_layer = 2 * 16 * 8192 * 64 * 2 / 4
    assert mha.layers - gqa.layers == pytest.approx(2 * per_layer, rel=0.01)  # two layers


def test_state_counts_each_chips_shards(tiny_configs, tpu_slice):
    configs = tiny_configs()
    slice_, devices = slice_devices(tpu_slice)
    run = apply_setting(configs, StepSetting((1, 4, 1), 1, "none", True), slice_.chip.platform)
    plan = recipe.make_plan(run.model, run.recipe)
    mesh = sharding.make_mesh((1, 4, 1), devices=devices)
    build = step_lib.build_step(run.model, plan, run.monitor, mesh, microbatches=1, z_loss=0.0, seed=0)
    state, params = footprint.state_bytes(build)
    whole = sum(x.size * 4 for x in jax.tree.leaves(build.abstract_state.params))
    assert whole / 4 <= params <= whole  # split four ways where the dims divide
    assert state >= 3 * params  # parameters and two moments


@pytest.mark.slow  # 2 min: a compile of the long tiny step per remat
@pytest.mark.parametrize("remat", REMATS)
def test_the_model_against_xla(tiny_configs, tpu_slice, remat):
    """The search trusts the model where it is sure (walk.SURE_FITS, walk.SLACK). The dangerous error is
    too few bytes: a step the model says fits by far must not be over the limit, so the model is never below
    XLA / SURE_FITS. Without remat it is within SLACK of XLA too. With remat, at these shapes, XLA keeps far less
    than a layer's recomputed activations at once and the model overcounts (a compile, not a loss); on the
    Celerity configs it is within its bounds (docs/results/compile.md)."""
    from celerity_jax.aot import walk

    configs = tiny_configs(*LONG)
    setting = StepSetting((1, 4, 1), 1, remat, True)
    xla = compile_report(configs, tpu_slice, setting, estimates="never")["bytes_per_chip"]
    model = _model(configs, tpu_slice, setting).total
    assert model >= xla / walk.SURE_FITS, model / xla
    if remat == "none":
        assert model <= walk.SLACK * xla, model / xla


def test_a_remat_policy_keeps_what_it_says(tiny_configs, tpu_slice):
    configs = tiny_configs(*LONG)
    full = _model(configs, tpu_slice, StepSetting((1, 4, 1), 1, "full", True))
    model = dataclasses.replace(configs.model, remat="full")
    # full remat keeps each layer's input: the residual stream of one chip's sequences, bfloat16 on a TPU
    per_layer = full.layers / model.n_layers
    assert per_layer == pytest.approx(4 * 8192 * model.d_model * 2, rel=0.05)


def test_a_mixture_counts_every_expert_its_dispatch_and_its_tokens_at_the_experts(tiny_configs, tpu_slice):
    """Against the dense model: the state holds every expert (float32 parameters and two moments, split over 4
    chips); each layer saves at least its B×L×E×C dispatch and combine tensors; and the tokens at the experts
    [E, B, C, D] are split over the chips as the batch is, so one chip saves 4 times what each of 4 does."""
    from celerity_jax.model.moe import expert_capacity
    from celerity_jax.model.params import count_params

    shape = ["RecipeConfig.seq_len = 256", "ModelConfig.max_seq_len = 256", "RecipeConfig.batch_seqs = 16"]
    dense, moe = tiny_configs(*shape), tiny_configs(*shape, "ModelConfig.n_experts = 4",
                                                     "ModelConfig.experts_per_token = 2")
    setting = StepSetting((1, 4, 1), 1, "none", False)
    d, m = _model(dense, tpu_slice, setting), _model(moe, tpu_slice, setting)
    assert m.state - d.state == pytest.approx(12 * (count_params(moe.model) - count_params(dense.model)) / 4,
                                              rel=0.01)
    dispatch_and_combine = 2 * 16 * 256 * 4 * expert_capacity(moe.model, 256) * 2 / 4  # bfloat16
    assert (m.layers - d.layers) / moe.model.n_layers >= dispatch_and_combine
    cfg = apply_setting(moe, setting, "tpu").model
    one_chip = footprint.footprint(cfg, sharding.make_mesh((1, 1, 1), slice_devices(tpu_slice)[1][:1]),
                                   microbatches=1, micro_seqs=16, seq_len=256, state=(0.0, 0.0))
    assert one_chip.layers == pytest.approx(4 * m.layers, rel=0.01)
