"""A Dense-layer matmul whose backward pass XLA:CPU runs as plain row-major GEMMs.

For y_MxF = x_MxD · w_DxF the weight gradient is x^T·g, a product contracting the long token axis M
of both operands. XLA:CPU lowers it by materializing a transpose of the *wider* operand and running a
slow generic dot. `transposed_grad_dot_general` computes the same gradient from an explicit transpose of
the *narrower* operand, held behind `optimization_barrier` so that XLA cannot fold it back into the dot's
dimension numbers, which leaves a plain (D,M)·(M,F) GEMM. The value computed is the same product up to
float rounding. Used on CPU only (`ModelConfig.dense_backward`); accelerators keep `lax.dot_general`.
"""

import jax
import jax.numpy as jnp


def transposed_grad_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                                **kwargs):
    """Drop-in `dot_general` for `nn.Dense(dot_general=...)`: x_...xD · w_DxF with the backward above.

    Any other contraction, an explicit precision or element type falls back to `lax.dot_general`."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    is_dense = (rhs.ndim == 2 and tuple(lhs_contract) == (lhs.ndim - 1,) and tuple(rhs_contract) == (0,)
                and not lhs_batch and not rhs_batch)
    if not is_dense or precision is not None or preferred_element_type is not None or kwargs:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type, **kwargs)
    return _matmul(lhs, rhs)


@jax.custom_vjp
def _matmul(x_MxD, w_DxF):
    return jnp.matmul(x_MxD, w_DxF)


def _matmul_fwd(x_MxD, w_DxF):
    return jnp.matmul(x_MxD, w_DxF), (x_MxD, w_DxF)


def _matmul_bwd(residuals, g_MxF):
    x_MxD, w_DxF = residuals
    d, f = w_DxF.shape
    dx_MxD = jax.lax.dot_general(g_MxF, w_DxF, (((g_MxF.ndim - 1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32).astype(x_MxD.dtype)
    x2_MxD, g2_MxF = x_MxD.reshape(-1, d), g_MxF.reshape(-1, f)
    if d <= f:
        dw_DxF = _gemm(_materialized_transpose(x2_MxD), g2_MxF)
    else:
        dw_DxF = _gemm(_materialized_transpose(g2_MxF), x2_MxD).T
    return dx_MxD, dw_DxF.astype(w_DxF.dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _materialized_transpose(a_MxN):
    return jax.lax.optimization_barrier(a_MxN.T)


def _gemm(a_NxM, b_MxK):
    return jnp.matmul(a_NxM, b_MxK, preferred_element_type=jnp.float32)
