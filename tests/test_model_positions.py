import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax.model import positions


def test_alibi_slopes_power_of_two_and_not():
    np.testing.assert_allclose(positions.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    # 12 heads: the 8-head series, then every other slope of the 16-head series (2^-0.5, 2^-1.5, ...).
    expected = list(2.0 ** -np.arange(1, 9)) + list(2.0 ** -(np.arange(4) + 0.5))
    np.testing.assert_allclose(positions.alibi_slopes(12), expected, rtol=1e-6)


def test_alibi_bias_penalizes_distance_to_the_past():
    bias = np.asarray(positions.alibi_bias(2, 4))
    assert bias.shape == (1, 2, 4, 4)
    np.testing.assert_allclose(bias[0, 0, 3], -0.0625 * np.array([3, 2, 1, 0]))  # slope 2^-4 for 2 heads
    np.testing.assert_allclose(np.diagonal(bias[0, 1]), 0.0)


def test_rope_scores_depend_only_on_relative_position():
    q_1xLx1xK = jnp.tile(jax.random.normal(jax.random.key(0), (1, 1, 1, 8)), (1, 6, 1, 1))
    k_1xLx1xK = jnp.tile(jax.random.normal(jax.random.key(1), (1, 1, 1, 8)), (1, 6, 1, 1))
    q, k = positions.apply_rope(q_1xLx1xK, 10000.0)[0, :, 0], positions.apply_rope(k_1xLx1xK, 10000.0)[0, :, 0]
    scores_LxL = np.asarray(q @ k.T)
    np.testing.assert_allclose(scores_LxL[3, 1], scores_LxL[5, 3], rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), np.linalg.norm(q_1xLx1xK[0, :, 0], axis=-1), rtol=1e-5)
    assert not np.isclose(scores_LxL[3, 1], scores_LxL[3, 2])
