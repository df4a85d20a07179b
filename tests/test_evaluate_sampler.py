import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.data.tokenizer import ByteTokenizer
from celerity_jax.evaluate import sampler
from celerity_jax.model import sharding, transformer
from celerity_jax.model.config import ModelConfig


def _model(positions: str, **overrides):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, vocab_size=257, max_seq_len=64,
                      positions=positions, d_base=32, n_layers_base=2, **overrides)
    return cfg, transformer.init_params(cfg, jax.random.key(1))


def _decoder(cfg, params):
    return sampler.Decoder(cfg, params, sharding.make_mesh((-1, 1, 1), jax.devices()[:1]))


PROMPTS = [[72, 101, 108, 108, 111], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [40]]


def _full_forward_last(cfg, params, tokens: list[int]):
    """The logits after `tokens` from a full forward over them (right-padded to the context, which a causal model
    does not see, so that one compile serves every length)."""
    padded = jnp.zeros((1, cfg.max_seq_len), jnp.int32).at[0, :len(tokens)].set(jnp.asarray(tokens))
    return transformer.apply(cfg, params, padded)[0, len(tokens) - 1]


@pytest.mark.parametrize("positions", ["alibi", "rope", "learned"])
def test_greedy_equals_argmax_of_the_full_forward_at_every_position(positions):
    cfg, params = _model(positions)
    generated = sampler.generate(_decoder(cfg, params), ByteTokenizer(), PROMPTS, max_new_tokens=12)
    for prompt, g in zip(PROMPTS, generated):
        tokens = list(prompt)
        for new in g.token_ids:
            assert new == int(jnp.argmax(_full_forward_last(cfg, params, tokens)))
            tokens.append(new)


@pytest.mark.parametrize("positions, kv_heads", [("alibi", None), ("rope", None), ("learned", None), ("rope", 1),
                                                 ("alibi", 1)])
def test_cached_logits_match_the_full_forward(positions, kv_heads):
    cfg, params = _model(positions, n_kv_heads=kv_heads)
    decoder = _decoder(cfg, params)
    rows, prompt_len, slots = 3, 8, 24
    tokens = np.asarray(jax.random.randint(jax.random.key(2), (rows, 20), 0, 257), np.int32)
    lengths = np.asarray([8, 5, 3], np.int32)
    padded = np.where(np.arange(prompt_len)[None, :] < lengths[:, None], tokens[:, :prompt_len], 0)
    cache = decoder.new_cache(rows, slots)
    key = jax.random.key(0)
    _, logits, cache = decoder.step(cache, padded, np.zeros(rows), lengths - 1, key, 0.0, 1.0)
    position = lengths.copy()
    for step in range(6):
        for b in range(rows):
            full = _full_forward_last(cfg, params, tokens[b, :position[b]].tolist())
            np.testing.assert_allclose(np.asarray(logits[b]), np.asarray(full), rtol=1e-5, atol=1e-5)
        fed = tokens[np.arange(rows), position][:, None]
        _, logits, cache = decoder.step(cache, fed, position, np.zeros(rows), key, 0.0, 1.0)
        position += 1


def test_grouped_key_value_heads_shrink_the_cache_by_the_group_factor():
    mha, gqa = (_decoder(*_model("rope", n_kv_heads=kv)).new_cache(3, 24) for kv in (None, 1))
    assert gqa.k_NxBxSxGxK.shape == (2, 3, 24, 1, 16) and mha.k_NxBxSxGxK.shape == (2, 3, 24, 2, 16)
    assert gqa.k_NxBxSxGxK.nbytes + gqa.v_NxBxSxGxK.nbytes == (mha.k_NxBxSxGxK.nbytes + mha.v_NxBxSxGxK.nbytes) // 2


def test_the_decode_step_compiles_once_for_all_tokens():
    cfg, params = _model("alibi")
    sampler.cached_step.clear_cache()
    sampler.generate(_decoder(cfg, params), ByteTokenizer(), PROMPTS[:2], max_new_tokens=20)
    assert sampler.cached_step._cache_size() == 2  # the prefill shape and the decode shape


def test_stop_strings_end_of_text_and_budget():
    tok = ByteTokenizer()
    assert sampler._check_stop(tok, list(b"ab\nc"), ("\n",), 10, False) == ("ab", "stop")
    assert sampler._check_stop(tok, [97, 256], (), 10, False) == ("a", "end_of_text")
    assert sampler._check_stop(tok, [97, 98], (), 2, False) == ("ab", "max_new_tokens")
    assert sampler._check_stop(tok, [97], (), 2, True) == ("a", "context")
    assert sampler._check_stop(tok, [97], (), 2, False) == ("a", None)


def test_sampling_is_seeded_and_top_p_keeps_the_nucleus():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]] * 2000))
    keys = jax.random.split(jax.random.key(3), 2)
    picks = [np.asarray(sampler.choose_next(logits, k, 1.0, 0.7)) for k in keys]
    assert set(np.unique(picks[0])) == {0, 1}  # 0.5 + 0.3 reaches 0.7
    assert abs(np.mean(picks[0] == 0) - 0.5 / 0.8) < 0.05
    np.testing.assert_array_equal(picks[0], np.asarray(sampler.choose_next(logits, keys[0], 1.0, 0.7)))
    assert set(np.unique(np.asarray(sampler.choose_next(logits, keys[1], 1.0, 1.0)))) == {0, 1, 2, 3}
    assert set(np.unique(np.asarray(sampler.choose_next(logits, keys[1], 0.0, 1.0)))) == {0}


def test_bucket_lengths():
    assert [sampler.bucket_length(n, 4096) for n in (1, 16, 17, 100, 200, 1000)] == [16, 16, 20, 112, 224, 1024]
    assert sampler.bucket_length(300, 256) == 256
