import math
import re
import textwrap

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.model import loss as loss_module

cross_entropy = jax.jit(loss_module.cross_entropy)


def test_uniform_logits_give_log_vocab_and_z_loss_adds_its_term():
    logits = jnp.zeros((2, 3, 50))
    targets = jnp.zeros((2, 3), jnp.int32)
    loss, aux = cross_entropy(logits, targets, z_loss=1e-2)
    assert float(aux["cross_entropy"]) == pytest.approx(math.log(50), rel=1e-6)
    assert float(aux["z_loss"]) == pytest.approx(math.log(50) ** 2, rel=1e-6)
    assert float(loss) == pytest.approx(math.log(50) + 1e-2 * math.log(50) ** 2, rel=1e-6)


def test_matches_log_softmax_and_accepts_bfloat16_logits():
    logits = jax.random.normal(jax.random.key(0), (2, 5, 11)) * 3
    targets = jax.random.randint(jax.random.key(1), (2, 5), 0, 11)
    log_p = np.asarray(jax.nn.log_softmax(logits))
    expected = -np.mean(np.take_along_axis(log_p, np.asarray(targets)[..., None], -1))
    loss, aux = cross_entropy(logits, targets)
    assert float(loss) == pytest.approx(expected, rel=1e-6) and float(loss) == float(aux["cross_entropy"])
    loss16, _ = cross_entropy(logits.astype(jnp.bfloat16), targets)
    assert loss16.dtype == jnp.float32 and float(loss16) == pytest.approx(expected, rel=2e-2)


def _features(batch=2, seq_len=12, d=8, vocab=37, dtype=jnp.float32, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    x = (jax.random.normal(k[0], (batch, seq_len, d)) * 2).astype(dtype)
    unembed = jax.random.normal(k[1], (d, vocab))
    targets = jax.random.randint(k[2], (batch, seq_len), 0, vocab)
    return x, unembed, targets


def _plain(x, unembed, targets, scale, z_loss):
    logits = jnp.dot(x, unembed.astype(x.dtype), preferred_element_type=jnp.float32) * scale
    return loss_module.cross_entropy(logits, targets, z_loss)


def _value_and_grads(fn, x, unembed):
    return jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(x, unembed)


@pytest.mark.parametrize("chunk_len", [1, 4, 6, 12])
@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_chunked_loss_matches_the_plain_loss_in_float32(chunk_len, z_loss):
    x, unembed, targets = _features()
    (got, got_aux), got_grads = _value_and_grads(lambda x, u: loss_module.chunked_cross_entropy(
        x, u, targets, logit_scale=0.7, chunk_len=chunk_len, z_loss=z_loss), x, unembed)
    (want, want_aux), want_grads = _value_and_grads(lambda x, u: _plain(x, u, targets, 0.7, z_loss), x, unembed)
    assert abs(float(got) - float(want)) <= 1e-6 * abs(float(want))
    for key in ("cross_entropy", "z_loss"):
        assert abs(float(got_aux[key]) - float(want_aux[key])) <= 1e-6 * abs(float(want_aux[key]))
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == w.dtype
        assert np.max(np.abs(np.asarray(g) - np.asarray(w))) <= 1e-6 * np.max(np.abs(np.asarray(w)))


def test_chunked_loss_in_bfloat16_and_unrolled():
    x, unembed, targets = _features(dtype=jnp.bfloat16, seq_len=16)
    want, want_grads = _value_and_grads(lambda x, u: _plain(x, u, targets, 0.5, 1e-3), x, unembed)
    for unroll in (False, True):
        got, got_grads = _value_and_grads(lambda x, u: loss_module.chunked_cross_entropy(
            x, u, targets, logit_scale=0.5, chunk_len=4, z_loss=1e-3, unroll=unroll), x, unembed)
        assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-6)  # the logits accumulate in float32
        assert got_grads[0].dtype == jnp.bfloat16 and got_grads[1].dtype == jnp.float32
        for g, w in zip(got_grads, want_grads):
            g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
            assert np.max(np.abs(g - w)) <= 1e-2 * np.max(np.abs(w))


def test_the_chunked_loss_and_its_gradient_never_hold_the_whole_logits():
    x, unembed, targets = _features(batch=2, seq_len=64, vocab=101)
    grad = jax.value_and_grad(lambda x, u: loss_module.chunked_cross_entropy(
        x, u, targets, logit_scale=1.0, chunk_len=8)[0], argnums=(0, 1))

    def largest(jaxpr):
        sizes = [math.prod(v.aval.shape) for eqn in jaxpr.eqns for v in eqn.outvars if hasattr(v.aval, "shape")]
        for eqn in jaxpr.eqns:
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                sizes.append(largest(sub))
        return max(sizes, default=0)

    assert largest(jax.make_jaxpr(grad)(x, unembed).jaxpr) == 2 * 8 * 101  # one chunk's logits
    plain = jax.value_and_grad(lambda x, u: _plain(x, u, targets, 1.0, 0.0)[0], argnums=(0, 1))
    assert largest(jax.make_jaxpr(plain)(x, unembed).jaxpr) == 2 * 64 * 101


def test_logits_chunk_len_auto_chunks_only_past_the_budget():
    budget_positions = loss_module.LOGITS_BUDGET_BYTES // (4 * 128256)  # one sequence of the Llama-3 vocabulary
    assert loss_module.logits_chunk_len("auto", 1, 256, 128256) == 256
    assert loss_module.logits_chunk_len("auto", 1, 8192, 128256) == 512 <= budget_positions
    assert loss_module.logits_chunk_len("auto", 4, 8192, 128256) == 128  # at least 128 positions per chunk
    assert loss_module.logits_chunk_len("auto", 1, 96, 10**7) == 96  # no divisor of 96 fits: the longest up to 128
    assert loss_module.logits_chunk_len(0, 1, 8192, 128256) == 8192
    assert loss_module.logits_chunk_len(1024, 1, 8192, 128256) == 1024


def test_a_chunk_that_does_not_divide_the_sequence_is_refused():
    with pytest.raises(ConfigError, match="logits_chunk_len=1000 does not divide the sequence length 8192"):
        loss_module.logits_chunk_len(1000, 1, 8192, 128256)
    x, unembed, targets = _features(seq_len=12)
    with pytest.raises(ConfigError, match="logits_chunk_len=5 does not divide the sequence length 12"):
        loss_module.chunked_cross_entropy(x, unembed, targets, logit_scale=1.0, chunk_len=5)


def test_on_eight_devices_the_sharded_chunked_loss_matches_one_device(on_eight_devices):
    code = textwrap.dedent("""
        import jax, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        from celerity_jax.model import loss, sharding

        mesh = sharding.make_mesh((2, 2, 2))
        k = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(k[0], (8, 32, 16))
        unembed = jax.random.normal(k[1], (16, 64))
        targets = jax.random.randint(k[2], (8, 32), 0, 64)
        grad = jax.value_and_grad(lambda x, u: loss.chunked_cross_entropy(
            x, u, targets, logit_scale=0.5, chunk_len=8, z_loss=1e-2)[0], argnums=(0, 1))
        want = jax.jit(grad)(x, unembed)
        x_sh = NamedSharding(mesh, P(("data", "fsdp"), None, None))
        u_sh = NamedSharding(mesh, P("fsdp", "tensor"))
        with jax.set_mesh(mesh):
            got = jax.jit(grad, in_shardings=(x_sh, u_sh), out_shardings=(None, (x_sh, u_sh)))(x, unembed)
        assert abs(float(got[0]) - float(want[0])) <= 1e-6 * abs(float(want[0]))
        for g, w in zip(got[1], want[1]):
            assert np.max(np.abs(np.asarray(g) - np.asarray(w))) <= 1e-6 * np.max(np.abs(np.asarray(w)))
        print("ok")
    """)
    assert "ok" in on_eight_devices(code)


def _loop_bodies(hlo: str) -> list[str]:
    computations = {c.split(" ", 1)[0].lstrip("%"): c for c in re.split(r"\n(?=\S)", hlo)}
    return [computations[name] for name in re.findall(r"body=%([\w.\-]+)", hlo)]


def test_compiled_for_a_tpu_slice_the_chunk_loop_holds_no_collective():
    """The unembedding is gathered, and its gradient reduced across chips, once per microbatch: not per chunk."""
    pytest.importorskip("libtpu", reason="libtpu (extra 'tpu') is absent")
    from jax.sharding import NamedSharding, PartitionSpec as P

    from celerity_jax.model import sharding
    from celerity_jax.aot.compile import slice_devices, without_persistent_cache

    mesh = sharding.make_mesh((1, 4, 1), slice_devices("v5p-8")[1])
    grad = jax.grad(lambda x, u, t: loss_module.chunked_cross_entropy(x, u, t, logit_scale=0.5, chunk_len=128)[0],
                    argnums=(0, 1))
    x = jax.ShapeDtypeStruct((4, 1024, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P(("data", "fsdp"))))
    unembed = jax.ShapeDtypeStruct((256, 32768), jnp.float32, sharding=NamedSharding(mesh, P("fsdp", "tensor")))
    targets = jax.ShapeDtypeStruct((4, 1024), jnp.int32, sharding=NamedSharding(mesh, P(("data", "fsdp"))))
    with without_persistent_cache(), jax.set_mesh(mesh):
        hlo = jax.jit(grad).lower(x, unembed, targets).compile().as_text()
    bodies = _loop_bodies(hlo)
    assert bodies, "no loop over the chunks"
    assert not [op for body in bodies for op in ("all-gather", "all-reduce", "reduce-scatter") if op in body]
