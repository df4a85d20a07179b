import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.evaluate import scoring
from celerity_jax.model import sharding, transformer
from celerity_jax.model.config import ModelConfig

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, vocab_size=257, max_seq_len=48, d_base=32,
                  n_layers_base=2)


def _requests(seed: int, n: int) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        context = rng.integers(0, 257, rng.integers(1, 40)).tolist()
        out.append((context, rng.integers(0, 257, rng.integers(1, 8)).tolist()))
    return out


def _alone(params, context, continuation) -> tuple[float, bool]:
    """One unpadded forward of the request alone."""
    tokens = (context + continuation)[-(CFG.max_seq_len + 1):]
    logits = transformer.apply(CFG, params, jnp.asarray([tokens[:-1]]))[0]
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    span = range(len(tokens) - 1 - len(continuation), len(tokens) - 1)
    return (float(sum(logprobs[i, tokens[i + 1]] for i in span)),
            all(int(jnp.argmax(logits[i])) == tokens[i + 1] for i in span))


@pytest.fixture(scope="module")
def params():
    return transformer.init_params(CFG, jax.random.key(0))


def _mesh():
    return sharding.make_mesh((-1, 1, 1), jax.devices()[:1])


def test_batching_never_changes_a_score(params):
    requests = _requests(0, 11)
    expected = [_alone(params, *r) for r in requests]
    for batch_size in (1, 4, 16):
        scorer = scoring.Scorer(CFG, params, _mesh(), batch_size)
        got = scorer.score(requests)
        np.testing.assert_allclose([s.logprob for s in got], [e[0] for e in expected], atol=1e-5, rtol=1e-5)
        assert [s.greedy for s in got] == [e[1] for e in expected]
        assert not any(s.truncated for s in got)
        fed = scorer.stats.fed_tokens
        assert scorer.stats.real_tokens == sum(len(c) + len(t) - 1 for c, t in requests) <= fed
        if batch_size == 1:  # one request a row: only the bucket's padding
            assert scorer.stats.real_share > 0.5


def test_a_greedy_continuation_is_marked_greedy(params):
    context = [5, 6, 7]
    logits = transformer.apply(CFG, params, jnp.asarray([context]))[0, -1]
    best = int(jnp.argmax(logits))
    got = scoring.Scorer(CFG, params, _mesh()).score([(context, [best]), (context, [(best + 1) % 257])])
    assert [s.greedy for s in got] == [True, False]
    assert got[0].logprob == pytest.approx(float(jax.nn.log_softmax(logits)[best]), abs=1e-5)


def test_a_long_request_keeps_its_last_tokens_and_the_continuation_whole(params):
    context, continuation = list(range(1, 80)), [3, 4, 5]
    got = scoring.Scorer(CFG, params, _mesh()).score([(context, continuation)])[0]
    assert got.truncated
    assert got.logprob == pytest.approx(_alone(params, context, continuation)[0], abs=1e-5)


def test_eight_devices_give_the_numbers_of_one(params, tmp_path, repo_root):
    requests = _requests(1, 13)
    expected = [s.logprob for s in scoring.Scorer(CFG, params, _mesh(), 8).score(requests)]
    code = textwrap.dedent(f"""
        import json, jax
        from celerity_jax.model import sharding
        from celerity_jax.evaluate import scoring
        from celerity_jax.model import transformer
        from celerity_jax.model.config import ModelConfig
        assert jax.device_count() == 8
        cfg = ModelConfig(**{CFG.__dict__!r})
        mesh = sharding.make_mesh((2, 2, 2))
        params = transformer.init_params(cfg, jax.random.key(0))
        params = jax.device_put(params, sharding.param_shardings(transformer.declarations(cfg), params, mesh))
        scores = scoring.Scorer(cfg, params, mesh, 8).score({requests!r})
        print(json.dumps([s.logprob for s in scores]))
    """)
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    np.testing.assert_allclose(json.loads(out.stdout.strip().splitlines()[-1]), expected, atol=1e-5, rtol=1e-5)
