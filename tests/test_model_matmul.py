import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.model import matmul

DENSE = lambda x: (((x.ndim - 1,), (0,)), ((), ()))  # noqa: E731


def _value_and_grads(dot_general, x, w, g):
    y, vjp = jax.vjp(lambda a, b: dot_general(a, b, DENSE(a)), x, w)
    return (y, *vjp(g))


# Odd shapes; both branches (input narrower than output, and wider), 2-D and 3-D inputs.
@pytest.mark.parametrize("x_shape,w_shape", [((7, 5), (5, 9)), ((7, 9), (9, 3)), ((3, 5, 7), (7, 11)),
                                             ((2, 13, 6), (6, 1)), ((1, 1), (1, 1))])
def test_value_and_gradients_match_the_plain_dot(x_shape, w_shape):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, x_shape)
    w = jax.random.normal(kw, w_shape)
    g = jax.random.normal(kg, x_shape[:-1] + w_shape[-1:])
    fast = jax.jit(lambda *a: _value_and_grads(matmul.transposed_grad_dot_general, *a))(x, w, g)
    plain = jax.jit(lambda *a: _value_and_grads(jax.lax.dot_general, *a))(x, w, g)
    for got, want in zip(fast, plain):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_weight_gradient_goes_through_an_explicit_transpose_behind_a_barrier():
    x, w = jnp.ones((6, 4)), jnp.ones((4, 8))
    grad = jax.grad(lambda w: jnp.sum(matmul.transposed_grad_dot_general(x, w, DENSE(x))))
    assert "optimization_barrier" in str(jax.make_jaxpr(grad)(w))
    assert "optimization_barrier" not in str(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(x @ w)))(w))


def test_bfloat16_operands_give_bfloat16_gradients():
    x = jax.random.normal(jax.random.key(1), (5, 3), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(2), (3, 4), jnp.bfloat16)
    g = jnp.ones((5, 4), jnp.bfloat16)
    y, dx, dw = _value_and_grads(matmul.transposed_grad_dot_general, x, w, g)
    assert (y.dtype, dx.dtype, dw.dtype) == (jnp.bfloat16,) * 3
    _, dx_ref, dw_ref = _value_and_grads(jax.lax.dot_general, x.astype(jnp.float32), w.astype(jnp.float32),
                                         g.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(dw, np.float32), np.asarray(dw_ref), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(dx_ref), rtol=2e-2, atol=2e-2)


def test_other_contractions_and_options_fall_back_to_lax_dot_general():
    a, b = jax.random.normal(jax.random.key(3), (4, 5)), jax.random.normal(jax.random.key(4), (4, 6))
    dims = (((0,), (0,)), ((), ()))
    np.testing.assert_allclose(np.asarray(matmul.transposed_grad_dot_general(a, b, dims)),
                               np.asarray(jax.lax.dot_general(a, b, dims)), rtol=1e-6)
    c = jax.random.normal(jax.random.key(5), (5, 3))
    jaxpr = jax.make_jaxpr(jax.grad(lambda c: jnp.sum(matmul.transposed_grad_dot_general(
        a, c, DENSE(a), precision=jax.lax.Precision.HIGHEST))))(c)
    assert "optimization_barrier" not in str(jaxpr)


def test_dense_layer_with_the_custom_dot_matches_the_plain_layer():
    x = jax.random.normal(jax.random.key(6), (2, 7, 12))
    plain, fast = nn.Dense(10), nn.Dense(10, dot_general=matmul.transposed_grad_dot_general)
    params = plain.init(jax.random.key(7), x)
    loss = lambda layer: lambda p: jnp.sum(jnp.sin(layer.apply(p, x)))  # noqa: E731
    np.testing.assert_allclose(np.asarray(fast.apply(params, x)), np.asarray(plain.apply(params, x)), rtol=1e-6)
    for got, want in zip(jax.tree.leaves(jax.grad(loss(fast))(params)), jax.tree.leaves(jax.grad(loss(plain))(params))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
