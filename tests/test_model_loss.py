import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
