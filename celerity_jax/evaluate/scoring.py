"""Log-likelihoods of continuations, batched by length: what lm-evaluation-harness asks a model for.

A request is (context token ids, continuation token ids). Its tokens are context + continuation; when they do not
fit the model's context, the last max_len + 1 of them are kept (the continuation whole where it fits), as the
harness's own models do, and the request counts as truncated. Requests are sorted by length, cut into batches and
right-padded to a bucketed length; the model is causal, so the padding after a row changes nothing before it,
and every request scores as it would alone, up to float rounding.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax.evaluate.sampler import bucket_length, inference_config
from celerity_jax.model import completep, loss, sharding, transformer
from celerity_jax.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Score:
    logprob: float    # log p(continuation | context), natural log
    greedy: bool      # whether every continuation token is the argmax at its position
    truncated: bool   # whether the context was cut to fit the model


@dataclasses.dataclass
class BatchStats:
    """Tokens fed to the model, and how many of them were requests' tokens (not padding)."""
    real_tokens: int = 0
    fed_tokens: int = 0

    @property
    def real_share(self) -> float:
        return self.real_tokens / self.fed_tokens if self.fed_tokens else 0.0


@functools.partial(jax.jit, static_argnums=0)
def target_logprobs(cfg: ModelConfig, params, inputs_BxL, targets_BxL):
    """(log p(target) float32_BxL, whether the target is the argmax bool_BxL) at every position. The logits are
    made chunk by chunk of positions (`loss.logits_chunk_len`), so the B×L×V logits need not exist at once."""
    batch, seq_len = inputs_BxL.shape
    x_BxLxD, unembed_DxV, _ = transformer.Transformer(cfg).apply({"params": params}, inputs_BxL, unembed=False)
    chunk = loss.logits_chunk_len(cfg.logits_chunk_len, sharding.local_batch(batch), seq_len, cfg.vocab_size)
    scale = completep.forward_multipliers(cfg)["output"]

    def one_chunk(args):
        x_BxCxD, targets_BxC = args
        logits_BxCxV = jnp.dot(x_BxCxD, unembed_DxV.astype(x_BxCxD.dtype), preferred_element_type=jnp.float32) * scale
        target_BxC = jnp.take_along_axis(logits_BxCxV, targets_BxC[..., None], axis=-1)[..., 0]
        logprob_BxC = target_BxC - jax.nn.logsumexp(logits_BxCxV, axis=-1)
        return logprob_BxC, jnp.argmax(logits_BxCxV, axis=-1) == targets_BxC

    logprob_NxBxC, greedy_NxBxC = jax.lax.map(one_chunk, (loss.by_chunk(chunk, x_BxLxD),
                                                          loss.by_chunk(chunk, targets_BxL)))
    unchunk = lambda t: t.swapaxes(0, 1).reshape(batch, seq_len)
    return unchunk(logprob_NxBxC), unchunk(greedy_NxBxC)


class Scorer:
    """Scores requests with a model (as `sampler.inference_config` runs it: a mixture of experts without drops) on
    its mesh, `batch_size` rows at a time (rounded up to a multiple of the mesh's batch shards, over which the rows
    are split)."""

    def __init__(self, cfg: ModelConfig, params, mesh: jax.sharding.Mesh, batch_size: int = 16):
        self.cfg, self.params, self.mesh = inference_config(cfg), params, mesh
        shards = sharding.data_shards(mesh)
        self.batch_size = -(-batch_size // shards) * shards
        self.stats = BatchStats()

    def score(self, requests: list[tuple[list[int], list[int]]]) -> list[Score]:
        max_len = self.cfg.max_seq_len
        rows = []
        for context, continuation in requests:
            tokens = (list(context) + list(continuation))[-(max_len + 1):]
            n_cont = min(len(continuation), len(tokens) - 1)
            rows.append((tokens, n_cont, len(context) + len(continuation) > max_len + 1))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out: list[Score | None] = [None] * len(rows)
        for first in range(0, len(order), self.batch_size):
            batch = order[first:first + self.batch_size]
            for i, score in zip(batch, self._score_batch([rows[i] for i in batch])):
                out[i] = score
        return out

    def _score_batch(self, rows) -> list[Score]:
        seq_len = bucket_length(max(len(tokens) - 1 for tokens, _, _ in rows), self.cfg.max_seq_len)
        inputs_BxL = np.zeros((self.batch_size, seq_len), np.int32)
        targets_BxL = np.zeros_like(inputs_BxL)
        for b, (tokens, _, _) in enumerate(rows):
            inputs_BxL[b, :len(tokens) - 1] = tokens[:-1]
            targets_BxL[b, :len(tokens) - 1] = tokens[1:]
        batch_sh = sharding.batch_sharding(self.mesh)
        with jax.set_mesh(self.mesh):
            logprob_BxL, greedy_BxL = jax.device_get(target_logprobs(
                self.cfg, self.params, jax.device_put(inputs_BxL, batch_sh), jax.device_put(targets_BxL, batch_sh)))
        self.stats.real_tokens += sum(len(tokens) - 1 for tokens, _, _ in rows)
        self.stats.fed_tokens += inputs_BxL.size
        scores = []
        for b, (tokens, n_cont, truncated) in enumerate(rows):
            span = slice(len(tokens) - 1 - n_cont, len(tokens) - 1)
            scores.append(Score(float(np.sum(logprob_BxL[b, span], dtype=np.float64)),
                                bool(np.all(greedy_BxL[b, span])), truncated))
        return scores
