import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from celerity_jax.errors import ConfigError
from celerity_jax.model import completep, loss, transformer
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.loss import cross_entropy

TINY = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, vocab_size=64, max_seq_len=8,
                   d_base=16, n_layers_base=1)


def _cfg(**overrides) -> ModelConfig:
    return ModelConfig(**{**TINY.__dict__, **overrides})


def _tokens(cfg, batch=2, seed=1):
    return jax.random.randint(jax.random.key(seed), (batch, cfg.max_seq_len), 0, cfg.vocab_size)


def test_loss_at_init_is_close_to_log_vocab_with_the_proxy_values():
    # ModelConfig defaults carry the proxy σ_base 8.67e-2, α_input 9.17, α_output 1.095.
    cfg = ModelConfig(n_layers=2, d_model=256, n_heads=4, head_dim=64, vocab_size=512, max_seq_len=32,
                      d_base=64, n_layers_base=2)
    params = transformer.init_params(cfg, jax.random.key(0))
    logits, stats = transformer.apply(cfg, params, _tokens(cfg, batch=4), return_stats=True)
    loss, _ = cross_entropy(logits, _tokens(cfg, batch=4, seed=2))
    assert abs(float(loss) - math.log(512)) < 0.03 * math.log(512)
    # Why it is close: the final norm makes the residual RMS 1, so the logits RMS is
    # α_output/m_d · σ_base · sqrt(d_model) = 1.095 · 8.67e-2 · sqrt(64 / 4) and the loss is ln V + RMS²/2.
    rms = 1.095 * 8.67e-2 * math.sqrt(64 / 4)
    assert float(stats["logits_rms"]) == pytest.approx(rms, rel=0.05)
    assert float(loss) == pytest.approx(math.log(512) + rms**2 / 2, abs=0.05)
    assert float(stats["embed_rms"]) == pytest.approx(9.17 * 8.67e-2, rel=0.05)


def test_forward_is_deterministic_under_jit():
    cfg = _cfg()
    params = transformer.init_params(cfg, jax.random.key(0))
    tokens = _tokens(cfg)
    a = transformer.apply(cfg, params, tokens)
    b = jax.jit(lambda p, t: transformer.apply(cfg, p, t))(params, tokens)
    assert a.dtype == jnp.float32 and a.shape == (2, 8, 64)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(transformer.init_params(cfg, jax.random.key(0)))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("positions", ["alibi", "rope", "learned"])
def test_attention_is_causal(positions):
    cfg = _cfg(positions=positions)
    params = transformer.init_params(cfg, jax.random.key(0))
    tokens = _tokens(cfg)
    changed = tokens.at[:, 5].set((tokens[:, 5] + 1) % cfg.vocab_size)
    a, b = transformer.apply(cfg, params, tokens), transformer.apply(cfg, params, changed)
    np.testing.assert_allclose(np.asarray(a[:, :5]), np.asarray(b[:, :5]), atol=1e-6)
    assert not np.allclose(np.asarray(a[:, 5:]), np.asarray(b[:, 5:]))


@pytest.mark.parametrize("cfg", [_cfg(), _cfg(positions="rope", parametrization="standard")])
def test_attention_matches_a_plain_reference(cfg):
    """Scores scaled by forward_multipliers['attention'], ALiBi bias or RoPE, causal softmax."""
    x_BxLxD = jax.random.normal(jax.random.key(3), (2, cfg.max_seq_len, cfg.d_model))
    module = transformer.Attention(cfg)
    p = nn.meta.unbox(module.init(jax.random.key(4), x_BxLxD)["params"])
    heads = lambda name: (x_BxLxD @ p[name]["kernel"]).reshape(2, cfg.max_seq_len, cfg.n_heads, cfg.head_dim)
    q, k, v = heads("q"), heads("k"), heads("v")
    pos = np.arange(cfg.max_seq_len)
    bias = np.zeros((cfg.n_heads, cfg.max_seq_len, cfg.max_seq_len))
    if cfg.positions == "rope":
        angle_Lx1xK2 = (pos[:, None] * 10000.0 ** (-np.arange(0, cfg.head_dim, 2) / cfg.head_dim))[:, None]
        cos, sin, half = np.cos(angle_Lx1xK2), np.sin(angle_Lx1xK2), cfg.head_dim // 2
        rot = lambda t: jnp.concatenate([t[..., :half] * cos - t[..., half:] * sin,
                                         t[..., :half] * sin + t[..., half:] * cos], -1)
        q, k = rot(q), rot(k)
    else:
        slopes = 2.0 ** (-8.0 * np.arange(1, cfg.n_heads + 1) / cfg.n_heads)
        bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :])
    scale = 1 / cfg.head_dim if cfg.parametrization != "standard" else 1 / math.sqrt(cfg.head_dim)
    scores = jnp.einsum("blhk,bmhk->bhlm", q, k) * scale + bias
    scores = jnp.where(pos[:, None] >= pos[None, :], scores, -jnp.inf)
    out = jnp.einsum("bhlm,bmhk->blhk", jax.nn.softmax(scores, -1), v).reshape(2, cfg.max_seq_len, -1)
    np.testing.assert_allclose(np.asarray(module.apply({"params": p}, x_BxLxD)),
                               np.asarray(out @ p["o"]["kernel"]), rtol=1e-4, atol=1e-4)


def test_scanned_layers_with_remat_compute_the_same_function():
    cfg = _cfg(use_bias=True)
    params = transformer.init_params(cfg, jax.random.key(0))
    stacked = {k: v for k, v in params.items() if not k.startswith("block_")}
    stacked["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs),
                                     *[params[f"block_{i}"] for i in range(cfg.n_layers)])
    scanned = _cfg(use_bias=True, scan_layers=True, remat="dots")
    assert jax.tree.structure(stacked) == jax.tree.structure(
        jax.eval_shape(lambda: transformer.init_params(scanned, jax.random.key(0))))
    tokens, targets = _tokens(cfg), _tokens(cfg, seed=2)
    loss_fn = lambda c: lambda p: cross_entropy(transformer.apply(c, p, tokens), targets)[0]
    grad_fn = lambda c: jax.jit(jax.value_and_grad(loss_fn(c)))
    loss_a, grads_a = grad_fn(cfg)(params)
    loss_b, grads_b = grad_fn(scanned)(stacked)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-5)
    np.testing.assert_allclose(np.asarray(grads_a["block_1"]["mlp"]["up"]["kernel"]),
                               np.asarray(grads_b["blocks"]["mlp"]["up"]["kernel"][1]), rtol=1e-4, atol=1e-6)


def test_init_std_follows_the_multipliers():
    cfg = ModelConfig(n_layers=2, d_model=128, n_heads=2, head_dim=64, vocab_size=512, max_seq_len=8,
                      d_base=32, n_layers_base=1, use_bias=True, scan_layers=True)
    params = transformer.init_params(cfg, jax.random.key(0))
    mult = completep.multipliers(cfg, transformer.declarations(cfg))
    stds = mult.init_std
    for x, std, role in zip(jax.tree.leaves(params), jax.tree.leaves(stds), jax.tree.leaves(mult.role)):
        x = np.asarray(x)
        if std > 0:
            assert x.std() == pytest.approx(std, rel=0.05) and abs(x.mean()) < 0.1 * std
        else:
            assert role in (completep.Role.BLOCK_VECTOR, completep.Role.FINAL_NORM)
            assert np.all((x == 1.0)) or np.all(x == 0.0)
    assert stds["blocks"]["attn"]["q"]["kernel"] == pytest.approx(cfg.sigma_base / 2)


def test_bfloat16_compute_keeps_float32_params_and_logits():
    cfg, cfg16 = _cfg(), _cfg(compute_dtype="bfloat16")
    params = transformer.init_params(cfg16, jax.random.key(0))
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float32")}
    tokens = _tokens(cfg)
    logits16 = transformer.apply(cfg16, params, tokens)
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits16), np.asarray(transformer.apply(cfg, params, tokens)),
                               atol=0.05 * float(jnp.abs(logits16).max()))


def test_tied_embeddings_have_no_unembedding_matrix():
    shapes = lambda cfg: jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    assert "unembed" not in shapes(_cfg(tie_embeddings=True)) and "unembed" in shapes(_cfg())


def test_too_long_input_is_a_config_error():
    cfg = _cfg()
    params = transformer.init_params(cfg, jax.random.key(0))
    with pytest.raises(ConfigError, match="max_seq_len"):
        transformer.apply(cfg, params, jnp.zeros((1, cfg.max_seq_len + 1), jnp.int32))


@pytest.mark.parametrize("positions,seq_len", [("alibi", 8), ("alibi", 7), ("rope", 7), ("learned", 8)])
def test_cpu_kernels_compute_the_same_loss_and_gradients(positions, seq_len):
    """Blocked attention and the transposed Dense backward against XLA's attention and plain backward."""
    fast = _cfg(positions=positions, max_seq_len=seq_len, attention_impl="blocked", dense_backward="transposed")
    plain = _cfg(positions=positions, max_seq_len=seq_len, attention_impl="xla", dense_backward="plain")
    params = transformer.init_params(fast, jax.random.key(0))
    tokens, targets = _tokens(fast), _tokens(fast, seed=2)
    loss_fn = lambda c: lambda p: cross_entropy(transformer.apply(c, p, tokens), targets)[0]  # noqa: E731
    loss_a, grads_a = jax.jit(jax.value_and_grad(loss_fn(fast)))(params)
    loss_b, grads_b = jax.jit(jax.value_and_grad(loss_fn(plain)))(params)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides", [dict(logits_chunk_len=2), dict(logits_chunk_len=4, tie_embeddings=True),
                                       dict(logits_chunk_len="auto", positions="learned")])
def test_the_chunked_loss_of_the_model_matches_its_whole_logits(overrides, monkeypatch):
    monkeypatch.setattr(loss, "LOGITS_BUDGET_BYTES", 2 * 4 * 64 * 4)  # "auto": chunks of 4 positions here
    monkeypatch.setattr(loss, "_MIN_AUTO_CHUNK", 1)
    assert loss.logits_chunk_len("auto", 2, 8, 64) == 4
    chunked = _cfg(**overrides)
    whole = _cfg(**{**overrides, "logits_chunk_len": 0})
    params = transformer.init_params(chunked, jax.random.key(0))
    tokens, targets = _tokens(chunked), _tokens(chunked, seed=2)
    loss_fn = lambda c: lambda p: transformer.next_token_loss(c, p, tokens, targets, z_loss=1e-3)  # noqa: E731
    (loss_a, aux_a), grads_a = jax.jit(jax.value_and_grad(loss_fn(chunked), has_aux=True))(params)
    (loss_b, aux_b), grads_b = jax.jit(jax.value_and_grad(loss_fn(whole), has_aux=True))(params)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-6)
    assert float(aux_a["cross_entropy"]) == pytest.approx(float(aux_b["cross_entropy"]), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_mlp_activations_follow_their_formulas():
    x = jnp.linspace(-4.0, 4.0, 81)
    xs = np.asarray(x, np.float64)
    exact = 0.5 * xs * (1 + np.vectorize(math.erf)(xs / math.sqrt(2)))  # x·Φ(x)
    tanh = 0.5 * xs * (1 + np.tanh(math.sqrt(2 / math.pi) * (xs + 0.044715 * xs**3)))
    np.testing.assert_allclose(transformer.ACTIVATIONS["gelu"](x), exact, atol=1e-6)
    np.testing.assert_allclose(transformer.ACTIVATIONS["gelu_tanh"](x), tanh, atol=1e-6)
    np.testing.assert_allclose(transformer.ACTIVATIONS["squared_relu"](x), np.maximum(xs, 0) ** 2, atol=1e-6)
    assert np.abs(exact - tanh).max() > 1e-4  # the two are different functions, not one spelled twice


def test_gelu_and_its_tanh_approximation_are_distinct_models():
    params = transformer.init_params(_cfg(mlp="gelu"), jax.random.key(0))
    tokens = _tokens(TINY)
    exact = transformer.apply(_cfg(mlp="gelu"), params, tokens)
    approx = transformer.apply(_cfg(mlp="gelu_tanh"), params, tokens)
    assert not np.allclose(exact, approx, rtol=0, atol=1e-7)
    np.testing.assert_allclose(exact, approx, rtol=1e-2, atol=1e-3)


def test_unstacked_layers_compute_what_the_scanned_ones_do():
    scanned = ModelConfig(n_layers=3, d_model=32, n_heads=2, head_dim=16, vocab_size=64, max_seq_len=16, d_base=32,
                          n_layers_base=2, scan_layers=True)
    params = transformer.init_params(scanned, jax.random.key(0))
    cfg, unstacked = transformer.unstack_layers(scanned, params)
    assert not cfg.scan_layers and sorted(k for k in unstacked if k.startswith("block")) == [
        "block_0", "block_1", "block_2"]
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
    np.testing.assert_allclose(transformer.apply(cfg, unstacked, tokens), transformer.apply(scanned, params, tokens),
                               rtol=1e-5, atol=1e-5)
    assert transformer.unstack_layers(cfg, unstacked) == (cfg, unstacked)


@pytest.mark.parametrize("remat,attention", [("dots", "blocked"), ("attention", "blocked"), ("qkv", "blocked"),
                                             ("full", "blocked"), ("attention", "flash")])
def test_every_remat_policy_computes_the_same_loss_and_gradients(remat, attention):
    cfg = _cfg(attention_impl=attention)
    params = transformer.init_params(cfg, jax.random.key(0))
    tokens, targets = _tokens(cfg), _tokens(cfg, seed=2)
    grad_fn = lambda c: jax.jit(jax.value_and_grad(  # noqa: E731
        lambda p: cross_entropy(transformer.apply(c, p, tokens), targets)[0]))
    (loss_a, grads_a), (loss_b, grads_b) = grad_fn(cfg)(params), grad_fn(_cfg(attention_impl=attention, remat=remat))(params)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_the_residual_stream_runs_in_its_dtype():
    float32, bfloat16 = _cfg(residual_dtype="float32"), _cfg(residual_dtype="bfloat16")
    assert _cfg().residual == "float32"  # "auto" on CPU
    params = transformer.init_params(float32, jax.random.key(0))
    tokens = _tokens(float32)
    forward = lambda cfg: jax.make_jaxpr(  # noqa: E731
        lambda p: transformer.Transformer(cfg).apply({"params": p}, tokens))(params)
    sums = lambda cfg: [e for e in forward(cfg).eqns  # noqa: E731  (the residual additions, B x L x D)
                        if e.primitive.name == "add" and e.outvars[0].aval.shape == (2, 8, 32)]
    assert sums(bfloat16) and {e.outvars[0].aval.dtype for e in sums(bfloat16)} == {jnp.dtype("bfloat16")}
    assert {e.outvars[0].aval.dtype for e in sums(float32)} == {jnp.dtype("float32")}
    a, b = (transformer.apply(cfg, params, tokens) for cfg in (float32, bfloat16))
    assert not np.array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("positions, attention", [("rope", "blocked"), ("alibi", "blocked"), ("rope", "xla"),
                                                  ("alibi", "flash")])
def test_grouped_query_attention_is_attention_over_keys_and_values_repeated_per_group(positions, attention):
    """n_kv_heads = 2 of 4 heads equals the 4-head model whose k and v kernels repeat each key/value head for the
    two query heads of its group (query head h reads key/value head h // 2)."""
    gqa = _cfg(d_model=64, n_heads=4, head_dim=16, n_kv_heads=2, positions=positions, attention_impl=attention)
    mha = _cfg(d_model=64, n_heads=4, head_dim=16, positions=positions, attention_impl=attention)
    params = transformer.init_params(gqa, jax.random.key(0))
    repeat = lambda w_DxGK: jnp.repeat(w_DxGK.reshape(64, 2, 16), 2, axis=1).reshape(64, 64)  # noqa: E731
    repeated = jax.tree.map(lambda x: x, params)
    for i in range(gqa.n_layers):
        for name in ("k", "v"):
            repeated[f"block_{i}"]["attn"][name]["kernel"] = repeat(params[f"block_{i}"]["attn"][name]["kernel"])
    assert params["block_0"]["attn"]["k"]["kernel"].shape == (64, 32)
    tokens = _tokens(gqa)
    np.testing.assert_allclose(np.asarray(transformer.apply(gqa, params, tokens)),
                               np.asarray(transformer.apply(mha, repeated, tokens)), rtol=1e-5, atol=1e-5)


def test_n_kv_heads_must_divide_n_heads():
    with pytest.raises(ConfigError, match="n_kv_heads=3 must divide n_heads=4"):
        _cfg(d_model=64, n_heads=4, head_dim=16, n_kv_heads=3)
