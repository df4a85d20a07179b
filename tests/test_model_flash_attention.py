"""The Pallas flash-attention kernels (TPU: `flash_attention`, GPU: `flash_attention_gpu`) against
`attention.causal_attention`: values and gradients in the Pallas interpreter on the CPU, and a compile of forward
and backward for a TPU slice (compile-only, through libtpu)."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from celerity_jax.model import attention, flash_attention, flash_attention_gpu, flash_common, positions

KERNELS = {"tpu": flash_attention.flash_attention, "gpu": flash_attention_gpu.flash_attention_gpu}


def _inputs(seq_len, heads, head_dim, dtype, batch=2):
    keys = jax.random.split(jax.random.key(seq_len * 100 + heads * 10 + head_dim), 4)
    q, k, v = (jax.random.normal(key, (batch, seq_len, heads, head_dim)).astype(dtype) for key in keys[:3])
    weights = jax.random.normal(keys[3], q.shape)
    return q, k, v, weights


def _value_and_grads(attend, q, k, v, weights):
    """attend(q, k, v) and the gradients of its weighted sum with respect to q, k, v, in one jitted program."""
    def loss(q, k, v):
        out = attend(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * weights), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _relative_error(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return np.max(np.abs(got - want)) / np.max(np.abs(want))


# (L, H, K, block_q, block_k, scale, ALiBi): several blocks per row with block_q <, = and > block_k, so the grid
# holds blocks off the diagonal (unmasked) and on it (masked); H = 1 or K = 128k reads [B, L, H·K] in place,
# other shapes go through the [B, H, L, K] transpose; the last case clamps both blocks to L (one block).
F32_CASES = [
    (64, 3, 32, 16, 32, 0.35, True),
    (128, 1, 64, 64, 32, 0.25, False),
    (128, 3, 64, 32, 32, 1 / 64, True),  # CompleteP's 1/head_dim
    (256, 3, 32, 64, 128, 0.35, False),
    (256, 1, 32, 128, 64, 0.35, True),
    (64, 3, 64, 128, 128, 0.25, True),
]
BF16_CASES = [
    (128, 3, 64, 32, 64, 0.25, True),
    (256, 1, 32, 64, 64, 0.35, False),
]


def _compare(case, dtype, kernel):
    seq_len, heads, head_dim, block_q, block_k, scale, alibi = case
    q, k, v, weights = _inputs(seq_len, heads, head_dim, dtype)
    slopes = positions.alibi_slopes(heads) if alibi else None
    out, grads = _value_and_grads(
        lambda q, k, v: KERNELS[kernel](q, k, v, scale=scale, alibi_slopes_H=slopes, block_q=block_q,
                                        block_k=block_k, interpret=True), q, k, v, weights)
    want_out, want_grads = _value_and_grads(
        lambda q, k, v: attention.causal_attention(q, k, v, scale=scale, alibi_slopes_H=slopes), q, k, v, weights)
    assert out.dtype == v.dtype and out.shape == q.shape
    return _relative_error(out, want_out), [_relative_error(g, w) for g, w in zip(grads, want_grads)]


# (case, dtype, bound on the relative error of the output and of each gradient)
TOLERANCES = [(case, jnp.float32, 2e-6) for case in F32_CASES] + [(case, jnp.bfloat16, 2e-2) for case in BF16_CASES]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case, dtype, bound", TOLERANCES, ids=str)
def test_values_and_gradients_match_the_reference(case, dtype, bound, kernel):
    out_error, grad_errors = _compare(case, dtype, kernel)
    assert out_error < bound
    assert max(grad_errors) < bound, grad_errors


# (G, K) with H = 4 query heads: H/G = 2 and 4 query heads per key/value head; K = 128 reads [B, L, H·K] in place
# on the TPU kernel, K = 16 goes through its [B, H, L, K] transpose.
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("alibi", [True, False])
@pytest.mark.parametrize("n_kv_heads, head_dim", [(2, 16), (1, 16), (2, 128)])
def test_grouped_query_attention_matches_the_reference(n_kv_heads, head_dim, alibi, kernel):
    q, _, _, weights = _inputs(32, 4, head_dim, jnp.float32, batch=1)
    _, k, v, _ = _inputs(32, n_kv_heads, head_dim, jnp.float32, batch=1)
    slopes = positions.alibi_slopes(4) if alibi else None
    out, grads = _value_and_grads(
        lambda q, k, v: KERNELS[kernel](q, k, v, scale=0.3, alibi_slopes_H=slopes, block_q=16, block_k=16,
                                        interpret=True), q, k, v, weights)
    want_out, want_grads = _value_and_grads(
        lambda q, k, v: attention.causal_attention(q, k, v, scale=0.3, alibi_slopes_H=slopes), q, k, v, weights)
    assert out.shape == q.shape and grads[1].shape == grads[2].shape == k.shape
    assert _relative_error(out, want_out) < 1e-5
    assert max(_relative_error(g, w) for g, w in zip(grads, want_grads)) < 1e-5


@pytest.mark.parametrize("kernel", KERNELS)
def test_query_heads_that_do_not_split_over_the_key_value_heads_are_refused(kernel):
    q, _, _, _ = _inputs(32, 4, 16, jnp.float32, batch=1)
    _, k, v, _ = _inputs(32, 3, 16, jnp.float32, batch=1)
    with pytest.raises(ValueError, match="the 4 query heads do not split into groups over the 3 key/value heads"):
        KERNELS[kernel](q, k, v, scale=0.3, interpret=True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_alibi_matches_dot_product_attention_with_a_bias_matrix(kernel):
    q, k, v, _ = _inputs(64, 2, 32, jnp.float32)
    out = KERNELS[kernel](q, k, v, scale=0.3, alibi_slopes_H=positions.alibi_slopes(2), block_q=16, block_k=32,
                          interpret=True)
    want = jax.nn.dot_product_attention(q, k, v, bias=positions.alibi_bias(2, 64), is_causal=True, scale=0.3,
                                        implementation="xla")
    assert _relative_error(out, want) < 2e-6


@pytest.mark.parametrize("kernel", KERNELS)
def test_block_sizes_that_do_not_divide_the_length_are_refused(kernel):
    q, k, v, _ = _inputs(96, 1, 32, jnp.float32)
    with pytest.raises(ValueError, match="block_q=64 does not divide the sequence length 96"):
        KERNELS[kernel](q, k, v, scale=0.3, block_q=64, interpret=True)


@pytest.mark.parametrize("seq_len, head_dim", [
    (96, 24),  # blocks of 32 (96 = 3 × 32), head_dim padded to 32
    (40, 16),  # 40 padded to 48 positions, blocks of 16
    (40, 24),  # both
])
def test_the_gpu_kernel_pads_what_triton_cannot_tile_and_picks_blocks_dividing_the_length(seq_len, head_dim):
    q, k, v, weights = _inputs(seq_len, 2, head_dim, jnp.float32)
    slopes = positions.alibi_slopes(2)
    out, grads = _value_and_grads(lambda q, k, v: flash_attention_gpu.flash_attention_gpu(
        q, k, v, scale=0.3, alibi_slopes_H=slopes, interpret=True), q, k, v, weights)
    want_out, want_grads = _value_and_grads(
        lambda q, k, v: attention.causal_attention(q, k, v, scale=0.3, alibi_slopes_H=slopes), q, k, v, weights)
    assert out.shape == q.shape and _relative_error(out, want_out) < 2e-6
    assert max(_relative_error(g, w) for g, w in zip(grads, want_grads)) < 2e-6


def test_the_gpu_kernel_refuses_blocks_triton_cannot_tile():
    q, k, v, _ = _inputs(96, 1, 32, jnp.float32)
    with pytest.raises(ValueError, match="block_q=96 is not a power of two"):
        flash_attention_gpu.flash_attention_gpu(q, k, v, scale=0.3, block_q=96, block_k=32, interpret=True)


@pytest.mark.parametrize("block_q, block_k", [(32, 32), (64, 32), (32, 64)])
def test_grids_hold_only_blocks_on_or_below_the_diagonal(block_q, block_k):
    cfg = flash_common.KernelConfig(scale=1.0, block_q=block_q, block_k=block_k, alibi=False, fused_heads=True,
                                    interpret=True)
    seq_len = 256
    visible = {(i // block_q, j // block_k) for i in range(seq_len) for j in range(i + 1)}
    for tables in (flash_attention._pairs_by_query(cfg, seq_len), flash_attention._pairs_by_key(cfg, seq_len)):
        pairs = list(zip(*(np.asarray(t).tolist() for t in tables)))
        assert len(pairs) == len(set(pairs)) and set(pairs) == visible


@pytest.mark.parametrize("n_kv_heads", [3, 1])
def test_the_gpu_kernels_lower_to_triton_for_cuda_without_a_gpu(n_kv_heads):
    q_spec = jax.ShapeDtypeStruct((2, 256, 3, 64), jnp.bfloat16)
    kv_spec = jax.ShapeDtypeStruct((2, 256, n_kv_heads, 64), jnp.bfloat16)
    slopes = positions.alibi_slopes(3)
    attend = lambda q, k, v: jnp.sum(flash_attention_gpu.flash_attention_gpu(  # noqa: E731
        q, k, v, scale=1 / 64, alibi_slopes_H=slopes).astype(jnp.float32))
    for fn, n_kernels in ((attend, 1), (jax.grad(attend, argnums=(0, 1, 2)), 3)):
        text = jax.jit(fn).trace(q_spec, kv_spec, kv_spec).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == n_kernels  # forward; forward, dq and dk/dv


@pytest.fixture
def tpu_devices():
    pytest.importorskip("libtpu", reason="libtpu (extra 'tpu') is absent")
    from celerity_jax.aot.compile import slice_devices, without_persistent_cache

    with without_persistent_cache():
        yield slice_devices("v5e-4")[1]


@pytest.mark.parametrize("seq_len", [512, 4096])
def test_forward_and_backward_compile_for_tpu_without_a_score_matrix(tpu_devices, seq_len):
    batch, heads, head_dim = 4, 2, 128
    mesh = Mesh(np.asarray(tpu_devices), ("b",))
    slopes = positions.alibi_slopes(heads)
    attend = jax.shard_map(
        lambda q, k, v: flash_attention.flash_attention(q, k, v, scale=1 / head_dim, alibi_slopes_H=slopes,
                                                        block_q=128, block_k=128),
        mesh=mesh, in_specs=(P("b"),) * 3, out_specs=P("b"))
    spec = jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), jnp.bfloat16,
                                sharding=NamedSharding(mesh, P("b")))
    grad = jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    scores_bytes_per_chip = (batch // len(tpu_devices)) * heads * seq_len * seq_len * 4
    for fn, n_kernels in ((attend, 1), (grad, 3)):
        compiled = jax.jit(fn).lower(spec, spec, spec).compile()
        # One Mosaic kernel forward; forward, dq and dk/dv for the gradient (no XLA fallback).
        assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == n_kernels
        # The blocked XLA attention (attention.causal_attention) needs about half this size in temporaries at L = 4096.
        assert compiled.memory_analysis().temp_size_in_bytes < scores_bytes_per_chip // 16


@pytest.mark.parametrize("head_dim", [128, 64])  # read in place as [B, L, H·K]; transposed to [B, H, L, K]
def test_grouped_query_attention_compiles_for_tpu(tpu_devices, head_dim):
    mesh = Mesh(np.asarray(tpu_devices), ("b",))
    slopes = positions.alibi_slopes(4)
    attend = jax.shard_map(
        lambda q, k, v: flash_attention.flash_attention(q, k, v, scale=1 / head_dim, alibi_slopes_H=slopes,
                                                        block_q=128, block_k=128),
        mesh=mesh, in_specs=(P("b"),) * 3, out_specs=P("b"))
    q_spec, kv_spec = (jax.ShapeDtypeStruct((4, 512, heads, head_dim), jnp.bfloat16,
                                            sharding=NamedSharding(mesh, P("b"))) for heads in (4, 2))
    grad = jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    for fn, n_kernels in ((attend, 1), (grad, 3)):
        compiled = jax.jit(fn).lower(q_spec, kv_spec, kv_spec).compile()
        assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == n_kernels


def test_the_model_with_flash_attention_matches_blocked_attention():
    from celerity_jax.model import transformer
    from celerity_jax.model.config import ModelConfig

    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=2, head_dim=32, vocab_size=97, max_seq_len=64,
                      compute_dtype="float32")
    params = transformer.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 64), 0, 97)
    flash = transformer.apply(dataclasses.replace(cfg, attention_impl="flash"), params, tokens)
    blocked = transformer.apply(dataclasses.replace(cfg, attention_impl="blocked"), params, tokens)
    assert _relative_error(flash, blocked) < 1e-5


def test_the_train_step_with_flash_attention_compiles_to_pallas_kernels_for_a_tpu(tpu_devices):
    from celerity_jax import gin_config
    from celerity_jax.aot.compile import StepSetting, apply_setting
    from celerity_jax.recipe import make_plan
    from celerity_jax.model.sharding import make_mesh
    from celerity_jax.train import step as step_lib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    configs = gin_config.parse_gin(
        [os.path.join(root, "experiments/tiny/d48.gin"), os.path.join(root, "tests/configs/smoke.gin")],
        ["ModelConfig.attention_impl = 'flash'", "ModelConfig.n_heads = 2", "ModelConfig.head_dim = 24"])
    run = apply_setting(configs, StepSetting((2, 1, 2), 1, "none", False), "tpu")
    plan = make_plan(run.model, run.recipe)
    build = step_lib.build_step(run.model, plan, run.monitor, make_mesh((2, 1, 2), devices=tpu_devices),
                                microbatches=1, z_loss=0.0, seed=0)
    text = build.lower(plan.batch_seqs, plan.seq_len).compile().as_text()
    assert text.count("tpu_custom_call") == 3 * run.model.n_layers  # forward, dq and dk/dv kernels per layer
