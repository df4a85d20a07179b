import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.model import attention, positions


def _qkv(seq_len, heads=3, head_dim=8, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(k, (2, seq_len, heads, head_dim)) for k in keys]


def _reference(q, k, v, scale, alibi):
    bias = positions.alibi_bias(q.shape[2], q.shape[1]) if alibi else None
    return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True, scale=scale, implementation="xla")


@pytest.mark.parametrize("seq_len", [1, 7, 16])
@pytest.mark.parametrize("alibi", [True, False])
@pytest.mark.parametrize("n_blocks", [1, 2, 3])
def test_matches_dot_product_attention_in_value_and_gradient(seq_len, alibi, n_blocks):
    q, k, v = _qkv(seq_len)
    slopes = positions.alibi_slopes(3) if alibi else None
    blocked = lambda q, k, v: attention.causal_attention(q, k, v, scale=0.3, alibi_slopes_H=slopes,  # noqa: E731
                                                         n_blocks=n_blocks)
    reference = lambda q, k, v: _reference(q, k, v, 0.3, alibi)  # noqa: E731
    np.testing.assert_allclose(np.asarray(blocked(q, k, v)), np.asarray(reference(q, k, v)), rtol=1e-5, atol=1e-5)
    weights = jax.random.normal(jax.random.key(9), q.shape)
    loss = lambda f: lambda *qkv: jnp.sum(jnp.sin(f(*qkv)) * weights)  # noqa: E731
    got = jax.grad(loss(blocked), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_later_keys_do_not_reach_earlier_queries():
    q, k, v = _qkv(9)
    out = attention.causal_attention(q, k, v, scale=1.0, alibi_slopes_H=positions.alibi_slopes(3))
    changed = attention.causal_attention(q, k.at[:, 6].add(5.0), v.at[:, 6].add(5.0), scale=1.0,
                                         alibi_slopes_H=positions.alibi_slopes(3))
    np.testing.assert_array_equal(np.asarray(out[:, :6]), np.asarray(changed[:, :6]))
    assert not np.allclose(np.asarray(out[:, 6:]), np.asarray(changed[:, 6:]))


def test_two_blocks_skip_a_quarter_of_the_scores():
    q, k, v = _qkv(16)
    f = lambda n: lambda q, k, v: attention.causal_attention(q, k, v, scale=1.0, n_blocks=n)  # noqa: E731
    flops = lambda n: jax.jit(f(n)).lower(q, k, v).compile().cost_analysis()["flops"]  # noqa: E731
    assert flops(2) < 0.85 * flops(1)


def test_bfloat16_inputs_keep_their_dtype():
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(8))
    out = attention.causal_attention(q, k, v, scale=0.5, alibi_slopes_H=positions.alibi_slopes(3))
    assert out.dtype == jnp.bfloat16
    ref = _reference(*(x.astype(jnp.float32) for x in (q, k, v)), 0.5, True)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref), atol=3e-2)


def _gqa_qkv(n_kv_heads, seq_len=12, heads=4, head_dim=8):
    keys = jax.random.split(jax.random.key(n_kv_heads), 3)
    q = jax.random.normal(keys[0], (2, seq_len, heads, head_dim))
    k, v = (jax.random.normal(key, (2, seq_len, n_kv_heads, head_dim)) for key in keys[1:])
    return q, k, v


@pytest.mark.parametrize("n_kv_heads", [1, 2])
@pytest.mark.parametrize("alibi", [True, False])
def test_grouped_query_attention_matches_attention_on_repeated_keys_and_values(n_kv_heads, alibi):
    q, k, v = _gqa_qkv(n_kv_heads)
    slopes = positions.alibi_slopes(4) if alibi else None
    repeat = lambda x: jnp.repeat(x, 4 // n_kv_heads, axis=2)  # noqa: E731  query head h reads kv head h // (H/G)
    grouped = lambda q, k, v: attention.causal_attention(q, k, v, scale=0.3, alibi_slopes_H=slopes)  # noqa: E731
    repeated = lambda q, k, v: grouped(q, repeat(k), repeat(v))  # noqa: E731
    weights = jax.random.normal(jax.random.key(9), q.shape)
    loss = lambda f: lambda *qkv: jnp.sum(jnp.sin(f(*qkv)) * weights)  # noqa: E731
    got_out, got_grads = jax.value_and_grad(loss(grouped), argnums=(0, 1, 2))(q, k, v)
    want_out, want_grads = jax.value_and_grad(loss(repeated), argnums=(0, 1, 2))(q, k, v)
    assert got_grads[1].shape == k.shape
    for a, b in zip((got_out, *got_grads), (want_out, *want_grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_cached_attention_over_a_grouped_cache_matches_causal_attention(n_kv_heads):
    q, k, v = _gqa_qkv(n_kv_heads)
    slopes = positions.alibi_slopes(4)
    # Each row's queries at their own positions, which must not see the cache slots after them.
    positions_BxL = jnp.array([[5, 6], [9, 10]])
    q_Bx2xHxK = q[jnp.arange(2)[:, None], positions_BxL]
    out = attention.cached_attention(q_Bx2xHxK, k, v, positions_BxL, scale=0.3, alibi_slopes_H=slopes)
    want = attention.causal_attention(q, k, v, scale=0.3, alibi_slopes_H=slopes)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want[jnp.arange(2)[:, None], positions_BxL]),
                               rtol=1e-5, atol=1e-6)


def test_query_heads_that_do_not_split_over_the_key_value_heads_are_refused():
    q, k, v = _gqa_qkv(3)
    match = r"the 4 query heads do not split into groups over the 3 key/value heads \(q \(2, 12, 4, 8\), k \(2, 12, 3"
    with pytest.raises(ValueError, match=match):
        attention.causal_attention(q, k, v, scale=0.3)
    with pytest.raises(ValueError, match=match):
        attention.cached_attention(q, k, v, jnp.zeros((2, 12), jnp.int32), scale=0.3)
