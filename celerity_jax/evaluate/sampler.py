"""Text generation with a KV cache: one jitted step serves the prefill (a batch of prompts, right-padded to a
bucketed length) and every decode step (one token per row), so a decode shape compiles once per batch and cache
size, never per token.

Rows are right-padded: row b's prompt fills positions 0..len_b−1, and its k-th new token is fed at position
len_b + k − 1, writing its keys and values over the padding. A query sees only the slots up to its own position,
so the padding is never attended to, and each row computes what it would alone, up to float rounding.
Sampling: temperature 0 is greedy (argmax); otherwise softmax(logits / T) restricted to the smallest set of
tokens whose probability reaches top_p (nucleus sampling). A mixture of experts runs without drops
(`inference_config`).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax.model import sharding, transformer
from celerity_jax.model.config import ModelConfig

STOPPED_ON = ("stop", "end_of_text", "max_new_tokens", "context")


@dataclasses.dataclass(frozen=True)
class Generation:
    token_ids: list[int]  # the new tokens, up to and including the one that stopped it
    text: str             # their text, cut before the first stop string
    stopped: str          # one of STOPPED_ON: a stop string, the tokenizer's end-of-text, the token budget, the context


def inference_config(cfg: ModelConfig) -> ModelConfig:
    """The model as sampling and scoring run it: a mixture of experts drops no route (capacity_factor None),
    whatever capacity it trained with. A decode step feeds one token per row, which no capacity drops, and the
    prefill and a scored batch are padded to a bucketed length that would set the capacity; without drops, the
    prefill, every decode step and the scorer compute one function of each row's tokens."""
    return cfg if cfg.n_experts == 1 else dataclasses.replace(cfg, capacity_factor=None)


def bucket_length(n: int, cap: int, minimum: int = 16) -> int:
    """n rounded up to one of four lengths per octave (at most ~25% padding, few compiled shapes), at most cap."""
    if n <= minimum:
        return min(minimum, cap)
    step = 2 ** (n.bit_length() - 3)
    return min(cap, -(-n // step) * step)


def choose_next(logits_BxV, key, temperature, top_p):
    """The next token of each row: argmax where temperature is 0, else a nucleus sample at that temperature."""
    greedy_B = jnp.argmax(logits_BxV, axis=-1)
    scaled_BxV = logits_BxV / jnp.maximum(temperature, 1e-6)
    sorted_BxV = jnp.sort(scaled_BxV, axis=-1)[:, ::-1]
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    kept_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV < top_p  # the mass before a token is short of top_p
    threshold_Bx1 = jnp.min(jnp.where(kept_BxV, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
    sampled_B = jax.random.categorical(key, jnp.where(scaled_BxV >= threshold_Bx1, scaled_BxV, -jnp.inf), axis=-1)
    return jnp.where(temperature > 0, sampled_B, greedy_B).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def cached_step(cfg: ModelConfig, params, cache: transformer.KVCache, tokens_BxL, start_B, last_B, key,
                temperature, top_p):
    """Feeds tokens_BxL at positions start_B + 0..L−1; returns (the next token of each row, chosen from the
    logits at index last_B, those float32 logits_BxV, the updated cache)."""
    positions_BxL = start_B[:, None] + jnp.arange(tokens_BxL.shape[1])[None, :]
    logits_BxLxV, cache = transformer.apply_cached(cfg, params, tokens_BxL, cache, positions_BxL)
    logits_BxV = jnp.take_along_axis(logits_BxLxV, last_B[:, None, None], axis=1)[:, 0]
    return choose_next(logits_BxV, key, temperature, top_p), logits_BxV, cache


class Decoder:
    """Runs `cached_step` for a model (as `inference_config` runs it) on its mesh: batches padded to a multiple of
    the mesh's batch shards and laid out over them."""

    def __init__(self, cfg: ModelConfig, params, mesh: jax.sharding.Mesh):
        self.cfg, self.params, self.mesh = inference_config(cfg), params, mesh
        self.shards = sharding.data_shards(mesh)
        cache_sh = sharding.kv_cache_sharding(mesh)
        self._empty_cache = jax.jit(functools.partial(transformer.init_cache, self.cfg), static_argnums=(0, 1),
                                    out_shardings=transformer.KVCache(cache_sh, cache_sh))

    def padded_rows(self, rows: int) -> int:
        return -(-rows // self.shards) * self.shards

    def _put(self, x):
        """Token rows split as the batch is; the per-row positions (a few ints) on every device."""
        where = sharding.batch_sharding(self.mesh) if x.ndim == 2 else sharding.replicated(self.mesh)
        return jax.device_put(x, where)

    def new_cache(self, rows: int, slots: int) -> transformer.KVCache:
        return self._empty_cache(rows, slots)

    def step(self, cache, tokens_BxL: np.ndarray, start_B: np.ndarray, last_B: np.ndarray, key, temperature: float,
             top_p: float):
        with jax.set_mesh(self.mesh):
            return cached_step(self.cfg, self.params, cache, self._put(tokens_BxL.astype(np.int32)),
                               self._put(start_B.astype(np.int32)), self._put(last_B.astype(np.int32)), key,
                               jnp.float32(temperature), jnp.float32(top_p))


def generate(decoder: Decoder, tokenizer, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, stop: tuple[str, ...] = (), batch_size: int = 8) -> list[Generation]:
    """Continues each prompt (token ids, at least one, shorter than the model's context) by up to max_new_tokens,
    stopping a row at a stop string, at the tokenizer's end-of-text token or where its context is full."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[Generation | None] = [None] * len(prompts)
    key = jax.random.key(seed)
    for first in range(0, len(order), batch_size):
        rows = order[first:first + batch_size]
        key, batch_key = jax.random.split(key)
        for i, g in zip(rows, _generate_batch(decoder, tokenizer, [prompts[i] for i in rows], max_new_tokens,
                                              temperature, top_p, batch_key, stop)):
            out[i] = g
    return out


def _generate_batch(decoder: Decoder, tokenizer, prompts, max_new_tokens, temperature, top_p, key, stop):
    cap = decoder.cfg.max_seq_len
    lengths = [len(p) for p in prompts]
    n_rows = decoder.padded_rows(len(prompts))
    prompt_len = bucket_length(max(lengths), cap)
    slots = bucket_length(max(lengths) + max_new_tokens, cap)
    tokens_BxL = np.zeros((n_rows, prompt_len), np.int32)
    len_B = np.ones(n_rows, np.int32)  # the padding rows hold one token
    for b, p in enumerate(prompts):
        tokens_BxL[b, :len(p)], len_B[b] = p, len(p)
    cache = decoder.new_cache(n_rows, slots)
    key, step_key = jax.random.split(key)
    next_B, _, cache = decoder.step(cache, tokens_BxL, np.zeros(n_rows), len_B - 1, step_key, temperature, top_p)
    new_ids = [[] for _ in prompts]
    stopped: list[str | None] = [None] * len(prompts)
    texts = [""] * len(prompts)
    position_B = len_B.copy()  # where each row's newest token will be fed
    for _ in range(max_new_tokens):
        chosen_B = np.asarray(jax.device_get(next_B))
        for b in range(len(prompts)):
            if stopped[b] is None:
                new_ids[b].append(int(chosen_B[b]))
                texts[b], stopped[b] = _check_stop(tokenizer, new_ids[b], stop, max_new_tokens,
                                                   position_B[b] >= slots)
        if all(s is not None for s in stopped):
            break
        key, step_key = jax.random.split(key)
        next_B, _, cache = decoder.step(cache, chosen_B[:, None], np.minimum(position_B, slots - 1),
                                        np.zeros(n_rows), step_key, temperature, top_p)
        position_B += 1
    return [Generation(ids, text, why or "max_new_tokens") for ids, text, why in zip(new_ids, texts, stopped)]


def _check_stop(tokenizer, ids: list[int], stop: tuple[str, ...], max_new_tokens: int, context_full: bool):
    """(the row's text so far, why it stops now or None)."""
    if ids[-1] == tokenizer.separator_id:
        return tokenizer.decode(ids[:-1]), "end_of_text"
    text = tokenizer.decode(ids)
    cuts = [text.find(s) for s in stop if s and s in text]
    if cuts:
        return text[:min(cuts)], "stop"
    if len(ids) >= max_new_tokens:
        return text, "max_new_tokens"
    return text, "context" if context_full else None
