"""All sharding rules: the device mesh, and one table from logical axes to mesh axes for every parameter and
activation.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with parameters and optimizer state
sharded, and a mixture's experts with expert parallelism), `tensor` (Megatron-style: column-parallel
q/k/v/up/gate, row-parallel o/down).
Every parameter declares the logical axis of each dim where transformer.py creates it (`params.Declaration`);
LOGICAL_RULES maps those, and the activations' logical axes, to mesh axes. A dimension that its mesh axis does not
divide is kept whole, so tiny models run on any mesh; `unsplit` and `unsplit_activations` name such dimensions, and
`celerity train` and `celerity compile` state them in their setting line.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axis -> the mesh axis (or axes, or None: whole on every chip) that splits it.
LOGICAL_RULES = {
    # parameters
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",       # query heads × head_dim
    "kv_heads": "tensor",    # key/value heads × head_dim
    "mlp": "tensor",
    "position": None,        # learned positions
    "norm": None,            # norm gains and biases: small, and read whole by every chip
    "layers": None,          # the stacked layers of scanned blocks
    # A mixture's experts (its stacked expert weights, the tokens at them). With expert parallelism
    # (ModelConfig.expert_parallel) fsdp splits them: fsdp already splits the batch, so one all-to-all within fsdp
    # takes a chip's tokens to their experts, the experts' weights and moments stay split as FSDP splits a dense
    # MLP's (never gathered whole), and no new mesh axis changes the dense plans. Without it every chip runs every
    # expert on its own tokens, the weights gathered as a dense MLP's.
    "expert": "fsdp",
    "expert_whole": None,
    # activations
    "batch": BATCH_AXES,
    "sequence": "tensor",    # the residual stream's positions (sequence parallelism)
    "activation_embed": None,
    "activation_heads": "tensor",
    "activation_kv_heads": "tensor",
    "activation_vocab": "tensor",
}

# The residual stream (B x L x D) between and inside blocks, which remat saves at every block's input: split like
# this, a tensor chip keeps a quarter of it at tensor 4, not all of it. docs/compile.md gives the measurement that
# chose the sequence over D.
RESIDUAL_AXES = ("batch", "sequence", "activation_embed")


def make_mesh(mesh_shape: tuple[int, int, int], devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all); one size may be -1."""
    devices = list(jax.devices() if devices is None else devices)
    shape = list(mesh_shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if len(devices) % known:
            raise ConfigError(f"mesh_shape={tuple(mesh_shape)} does not divide the {len(devices)} devices; "
                              "choose sizes whose product divides the device count")
        shape[shape.index(-1)] = len(devices) // known
    if math.prod(shape) != len(devices):
        raise ConfigError(f"mesh_shape={tuple(mesh_shape)} needs {math.prod(shape)} devices but "
                          f"{len(devices)} are present; make the product equal the device count or use -1")
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def data_shards(mesh: Mesh) -> int:
    """How many ways the batch is split: data × fsdp."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def traced_batch_shards() -> int:
    """data × fsdp of the mesh being traced under (`jax.set_mesh`); 1 without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return 1
    return data_shards(mesh)


def local_batch(batch: int, mesh: Mesh | None = None) -> int:
    """Rows of a [batch, ...] activation on one chip of `mesh` (default: the mesh being traced under): the batch
    split over data × fsdp where that divides it, else whole (`unsplit_activations` states it)."""
    shards = traced_batch_shards() if mesh is None else data_shards(mesh)
    return batch // shards if batch % shards == 0 else batch


def constrain_vocab_split(x_DxV):
    """Keeps a [D, V] matrix whole on every chip except for V split over tensor (where it divides): the
    unembedding gathered once before the loss loops over chunks, rather than in every chunk."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or "tensor" not in mesh.axis_names:
        return x_DxV
    return jax.lax.with_sharding_constraint(x_DxV, logical_spec(("activation_embed", "activation_vocab"),
                                                                x_DxV.shape, mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batch rows split over data and fsdp; the sequence stays whole."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


def kv_cache_sharding(mesh: Mesh) -> NamedSharding:
    """A KV cache [layers, rows, slots, heads, head_dim]: its rows split as the batch is."""
    return NamedSharding(mesh, P(None, BATCH_AXES))


def constrain_batch(x):
    """Keeps an activation's leading (batch) axis split over the batch axes of the mesh being traced under
    (`jax.set_mesh`); unchanged without one. Without it XLA may lay activations out like the FSDP-sharded
    weights they meet, and gather whole microbatches onto each chip."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES, *[None] * (x.ndim - 1)))


def constrain(x, axes: tuple[str | None, ...]):
    """x laid out by the logical `axes` under the mesh being traced (`jax.set_mesh`); unchanged without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(axes, x.shape, mesh))


def constrain_residual(x_BxLxD):
    """The residual stream laid out by RESIDUAL_AXES under the mesh being traced (`jax.set_mesh`); unchanged
    without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
        return constrain_batch(x_BxLxD)
    return jax.lax.with_sharding_constraint(x_BxLxD, logical_spec(RESIDUAL_AXES, x_BxLxD.shape, mesh))


def map_over_batch_and_heads(fn, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *per_head_H):
    """fn(q, k, v, *per_head) applied shard by shard under the mesh being traced (`jax.set_mesh`): the batch
    split over data × fsdp and the query and key/value heads over tensor, where they divide; called whole without
    a mesh. For kernels that XLA cannot partition (Pallas calls).

    Each chip must hold the key/value heads its query heads read (query head h reads h // (H/G)), so the heads
    are split only when tensor divides both H and G. Fewer key/value heads than tensor chips are first repeated to
    one per chip (which keeps that reading), and when neither works the heads stay whole
    (`unsplit_activations` states it)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
        return fn(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *per_head_H)
    tensor, kv_heads = mesh.shape["tensor"], k_BxLxGxK.shape[2]
    if q_BxLxHxK.shape[2] % tensor == 0 and tensor % kv_heads == 0 and kv_heads < tensor:
        k_BxLxGxK, v_BxLxGxK = (jnp.repeat(t, tensor // kv_heads, axis=2) for t in (k_BxLxGxK, v_BxLxGxK))
    q_spec = logical_spec(("batch", None, "activation_heads", None), q_BxLxHxK.shape, mesh)
    kv_spec = logical_spec(("batch", None, "activation_kv_heads", None), k_BxLxGxK.shape, mesh)
    if q_spec[2] is None or kv_spec[2] is None:
        q_spec, kv_spec = P(q_spec[0], None, None, None), P(kv_spec[0], None, None, None)
    head_spec = P(q_spec[2])
    return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec) + (head_spec,) * len(per_head_H),
                         out_specs=q_spec)(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *per_head_H)


def _split(logical: str | None) -> tuple[str, ...]:
    """The mesh axes that split the logical axis `logical` (none for None)."""
    if logical is None:
        return ()
    if logical not in LOGICAL_RULES:
        raise ValueError(f"the logical axis {logical!r} has no entry in sharding.LOGICAL_RULES; add one")
    axes = LOGICAL_RULES[logical]
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def _divides(logical: str | None, size: int, mesh: Mesh) -> bool:
    return size % math.prod(mesh.shape[a] for a in _split(logical)) == 0


def logical_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
    """The spec of an array whose dims have the logical `axes`: each dim split over its rule's mesh axes where they
    divide it, else whole. A mesh axis splits one dim at most, the first that it splits: later dims keep the rest
    of their rule (an expert weight's experts take fsdp and its embed dim stays whole; dispatched tokens' experts
    take fsdp and their batch keeps data)."""
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {axes} do not match the shape {shape}; declare one axis per dim")
    taken, spec = set(), []
    for logical, size in zip(axes, shape):
        split = tuple(a for a in _split(logical) if a not in taken)
        if split and size % math.prod(mesh.shape[a] for a in split) == 0:
            taken.update(split)
            spec.append(split[0] if len(split) == 1 else split)
        else:
            spec.append(None)
    return P(*spec)


def _undivided(name: str, logical: str, size: int, mesh: Mesh) -> str | None:
    if _divides(logical, size, mesh):
        return None
    split = _split(logical)
    return f"{name} ({size}) over {'×'.join(split)} ({math.prod(mesh.shape[a] for a in split)})"


def unsplit(declared, params, mesh: Mesh) -> list[str]:
    """The parameter dims that their mesh axis does not divide, kept whole on every chip: one entry per logical
    axis and size, e.g. "vocab (257) over tensor (2)". `declared`: `transformer.declarations`; `params`: the
    parameters or their shapes."""
    out = []
    for d, x in zip(jax.tree.leaves(declared), jax.tree.leaves(params)):
        for logical, size in zip(d.axes, x.shape):
            entry = _undivided(logical, logical, size, mesh)
            if entry and entry not in out:
                out.append(entry)
    return out


def unsplit_activations(cfg: ModelConfig, rows: int, seq_len: int, mesh: Mesh) -> list[str]:
    """The activation dims that their mesh axis does not divide, kept whole on every chip: the batch (`rows` per
    microbatch), the residual stream's sequence, and the heads of a flash kernel (`map_over_batch_and_heads`)."""
    found = [_undivided("batch rows", "batch", rows, mesh), _undivided("sequence", "sequence", seq_len, mesh)]
    tensor = mesh.shape["tensor"]
    kv_splits = cfg.kv_heads % tensor == 0 or tensor % cfg.kv_heads == 0
    if cfg.attention_kernel == "flash" and (cfg.n_heads % tensor or not kv_splits):
        found.append(f"attention heads {cfg.n_heads} and kv heads {cfg.kv_heads} over tensor ({tensor}), which "
                     "must divide the heads and divide or be divided by the kv heads")
    return [entry for entry in found if entry]


def unsplit_note(dims: list[str]) -> str:
    """How a setting line states `unsplit`'s dims ("" when there are none)."""
    return f"; kept whole, the mesh axis does not divide them: {', '.join(dims)}" if dims else ""


def param_shardings(declared, params, mesh: Mesh):
    """A NamedSharding per leaf of `params` (arrays or ShapeDtypeStructs), from its declaration in `declared`
    (`transformer.declarations`)."""
    return jax.tree.map(lambda d, x: NamedSharding(mesh, logical_spec(d.axes, x.shape, mesh)), declared, params)


def with_shardings(abstract, shardings):
    """ShapeDtypeStructs of the `abstract` tree carrying `shardings` (a matching tree): inputs to lower ahead of time."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def opt_state_shardings(optimizer: optax.GradientTransformation, abstract_opt_state, param_sh, mesh: Mesh):
    """Moments take their parameter's sharding; counters and hyperparameters are replicated."""
    return optax.tree_map_params(optimizer, lambda _, s: s, abstract_opt_state, param_sh,
                                 transform_non_params=lambda _: replicated(mesh))


def check_batch_divisible(batch_seqs: int, mesh: Mesh, microbatches: int) -> None:
    """Every microbatch must split evenly over the batch axes of the mesh."""
    shards = data_shards(mesh)
    if batch_seqs % microbatches or (batch_seqs // microbatches) % shards:
        raise ConfigError(
            f"batch of {batch_seqs} sequences in {microbatches} microbatches does not split over "
            f"{shards} data x fsdp shards; choose a batch divisible by microbatches x {shards}")

