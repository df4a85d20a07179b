"""A train step's bytes per chip, worked out without compiling it: what `celerity compile --search` prunes with.

    bytes = state + gradients + L × a layer's saved activations + the rest of the model's saved activations
            + the working set of the backward pass

- state: every leaf of the train state (parameters, every expert of a mixture among them, Adam moments, monitor)
  at its per-chip shard shape;
- gradients: one float32 parameter tree per chip, two with microbatches (the running sum and the microbatch's);
- saved activations: what the backward pass keeps from the forward pass under the remat policy, read off JAX's
  own residuals of the loss's vjp (traced under `eval_shape` for one microbatch on the mesh, no compile) at
  depth 1 and 2: a layer's r(2) − r(1), the embedding's, final norm's and loss's 2·r(1) − r(2). An array whose
  leading dim is a multiple of the microbatch (a mixture of experts' B×L×E×C dispatch and combine tensors among
  them), or a mixture's tokens at its experts [E, B, C, ...], is split over the data shards and the tensor axis;
  a parameter kept for the backward pass is already in the state, and its bfloat16 copy is counted sharded as
  the parameter; anything else is counted whole;
- the working set: with remat, the backward pass recomputes one layer's activations, r_none − r_remat of one
  layer more; the loss chunk's float32 logits and their gradient.

XLA fuses and reuses buffers this count cannot see, so the model is an estimate: `compare` puts it next to XLA's
number for every setting the search compiles, and the search compiles every setting it keeps.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from celerity_jax.aot.compile import StepSetting, Target
from celerity_jax.model import loss, sharding, transformer
from celerity_jax.train import step as step_lib

@dataclasses.dataclass(frozen=True)
class Footprint:
    state: float
    gradients: float
    layers: float  # saved activations of all layers
    rest: float  # saved activations of the embedding, final norm and loss
    working: float

    @property
    def total(self) -> float:
        return self.state + self.gradients + self.layers + self.rest + self.working


def per_chip_bytes(abstract, shardings) -> float:
    """Bytes of one chip's shards of a tree of ShapeDtypeStructs laid out with `shardings`."""
    return float(sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
                     for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings))))


def state_bytes(build: step_lib.StepBuild) -> tuple[float, float]:
    """(the train state's bytes per chip, its float32 parameters' bytes per chip) on `build`'s mesh."""
    state = per_chip_bytes(build.abstract_state, build.state_shardings)
    params = per_chip_bytes(jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32),
                                         build.abstract_state.params), build.state_shardings.params)
    return state, params


def footprint(cfg, mesh, *, microbatches: int, micro_seqs: int, seq_len: int,
              state: tuple[float, float]) -> Footprint:
    """The bytes per chip of the step of model `cfg` on `mesh` in `microbatches` of `micro_seqs` sequences of
    `seq_len` tokens; `state` is `state_bytes` of a build on that mesh."""
    one, two = (_residual_bytes(dataclasses.replace(cfg, n_layers=n, scan_layers=False), micro_seqs, seq_len, mesh)
                for n in (1, 2))
    layer = two - one
    working = _loss_working_bytes(cfg, micro_seqs, seq_len, mesh)
    if cfg.remat != "none":
        none = dataclasses.replace(cfg, remat="none", scan_layers=False)
        layer_none = (_residual_bytes(dataclasses.replace(none, n_layers=2), micro_seqs, seq_len, mesh)
                      - _residual_bytes(dataclasses.replace(none, n_layers=1), micro_seqs, seq_len, mesh))
        working += max(layer_none - layer, 0.0)
    return Footprint(state=state[0], gradients=state[1] * (2 if microbatches > 1 else 1), layers=cfg.n_layers * layer,
                     rest=max(2 * one - two, 0.0), working=working)


def of_setting(configs, topology: str, setting: StepSetting) -> Footprint:
    """The footprint of the run `configs` on the slice `topology` with `setting`, as `celerity compile` would
    build its step."""
    target = Target.of(configs, topology, setting)
    return footprint(target.run.model, target.mesh, microbatches=setting.microbatches,
                     micro_seqs=target.micro_seqs, seq_len=target.plan.seq_len, state=state_bytes(target.build()))


def _loss_working_bytes(cfg, micro_seqs: int, seq_len: int, mesh) -> float:
    local = sharding.local_batch(micro_seqs, mesh)
    chunk = loss.logits_chunk_len(cfg.logits_chunk_len, local, seq_len, cfg.vocab_size)
    tensor = mesh.shape["tensor"] if cfg.vocab_size % mesh.shape["tensor"] == 0 else 1
    return 2.0 * local * chunk * cfg.vocab_size / tensor * 4  # float32 logits and their gradient


@functools.lru_cache(maxsize=256)
def _residual_bytes(cfg, micro_seqs: int, seq_len: int, mesh) -> float:
    """Per-chip bytes of the residuals JAX keeps for the loss's backward pass at one microbatch."""
    params = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    tokens = jax.ShapeDtypeStruct((micro_seqs, seq_len), jnp.int32)
    loss_fn = step_lib.make_loss(cfg, 0.0)

    def residuals(p, batch):
        return jax.vjp(lambda p: loss_fn(p, batch), p, has_aux=True)[1]

    with jax.set_mesh(mesh):
        vjp = jax.eval_shape(residuals, params, {"inputs": tokens, "targets": tokens})
    shards, tensor = sharding.data_shards(mesh), mesh.shape["tensor"]
    weight_chips = mesh.shape["fsdp"] * tensor
    param_shapes = {p.shape for p in jax.tree.leaves(params)}
    total = 0.0
    for a in jax.tree.leaves(vjp):
        size = math.prod(a.shape) * a.dtype.itemsize
        if a.shape in param_shapes:  # a parameter (counted in the state) or its bfloat16 copy, sharded
            size = 0.0 if a.dtype == jnp.float32 else size / weight_chips
        elif a.ndim >= 2 and (a.shape[0] % micro_seqs == 0 or _expert_leading(cfg, a, micro_seqs)):
            # batch-leading (the flash kernel folds head groups into the batch on a tensor mesh), or a mixture's
            # tokens at its experts [E, B, C, ...] (split over the data shards too: their experts over fsdp and
            # batch over data with expert parallelism, their batch over both without). XLA splits activations
            # over the tensor axis too, model-wide ones included where it can: counting them split errs low,
            # which costs a compile rather than a setting
            size /= (shards if micro_seqs % shards == 0 else 1) * tensor
        total += size
    return total


def _expert_leading(cfg, a, micro_seqs: int) -> bool:
    return cfg.n_experts > 1 and a.ndim >= 3 and a.shape[0] == cfg.n_experts and a.shape[1] % micro_seqs == 0
