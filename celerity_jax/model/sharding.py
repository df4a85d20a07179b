"""All sharding rules: the device mesh, and a PartitionSpec for the batch, the residual stream and every parameter.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with parameters and optimizer state
sharded), `tensor` (Megatron-style: column-parallel q/k/v/up/gate, row-parallel o/down).
Every parameter is a vector (norm gains, biases: replicated) or named in PARAM_RULES by the module names that
transformer.py gives; any other parameter is an error. A dimension that its rule's mesh axis does not divide is
kept whole, so tiny models run on any mesh; `unsplit` names such dimensions, and `celerity train` and
`celerity compile` state them in their setting line.
"""

import math

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from celerity_jax.errors import ConfigError
from celerity_jax.model.completep import path_keys

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Parameter name (the module name on its path, or the parameter's own) -> the mesh axis of each of its trailing
# (unscanned) dims.
PARAM_RULES = {
    "embed": ("tensor", "fsdp"),        # V x D
    "pos_embed": (None, "fsdp"),        # L x D
    "unembed": ("fsdp", "tensor"),      # D x V
    "q": ("fsdp", "tensor"),            # D x HK
    "k": ("fsdp", "tensor"),
    "v": ("fsdp", "tensor"),
    "up": ("fsdp", "tensor"),           # D x F
    "gate": ("fsdp", "tensor"),
    "o": ("tensor", "fsdp"),            # HK x D
    "down": ("tensor", "fsdp"),         # F x D
}
VECTOR_LEAVES = ("scale", "bias")  # replicated

# The residual stream (B x L x D) between and inside blocks, which remat saves at every block's input: the batch
# over the batch axes, the sequence over tensor where it divides (sequence parallelism; split like this, a tensor
# chip keeps a quarter of it at tensor 4, not all of it). docs/compile.md gives the measurement that chose the
# sequence over D.
RESIDUAL_RULE = (BATCH_AXES, "tensor", None)


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
    split over data × fsdp where that divides it, else whole."""
    shards = traced_batch_shards() if mesh is None else data_shards(mesh)
    return batch // shards if batch % shards == 0 else batch


def constrain_vocab_split(x_DxV):
    """Keeps a [D, V] matrix whole on every chip except for V split over tensor (where it divides): the
    unembedding gathered once before the loss loops over chunks, rather than in every chunk."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or "tensor" not in mesh.axis_names:
        return x_DxV
    tensor = "tensor" if x_DxV.shape[1] % mesh.shape["tensor"] == 0 else None
    return jax.lax.with_sharding_constraint(x_DxV, P(None, tensor))


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


def constrain_residual(x_BxLxD):
    """The residual stream laid out by RESIDUAL_RULE under the mesh being traced (`jax.set_mesh`); unchanged
    without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
        return constrain_batch(x_BxLxD)
    spec = [axes if isinstance(axes, tuple) or _divides(axes, size, mesh) else None
            for axes, size in zip(RESIDUAL_RULE, x_BxLxD.shape)]
    return jax.lax.with_sharding_constraint(x_BxLxD, P(*spec))


def map_over_batch_and_heads(fn, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, *per_head_H):
    """fn(q, k, v, *per_head) applied shard by shard under the mesh being traced (`jax.set_mesh`): the batch
    split over data × fsdp and the heads over tensor, where they divide; called whole without a mesh. For
    kernels that XLA cannot partition (Pallas calls)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
        return fn(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, *per_head_H)
    batch, _, heads, _ = q_BxLxHxK.shape
    batch_axes = BATCH_AXES if batch % data_shards(mesh) == 0 else None
    head_axis = "tensor" if heads % mesh.shape["tensor"] == 0 else None
    spec = P(batch_axes, None, head_axis, None)
    return jax.shard_map(fn, mesh=mesh, in_specs=(spec, spec, spec) + (P(head_axis),) * len(per_head_H),
                         out_specs=spec)(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, *per_head_H)


def _rule(path: tuple[str, ...], shape: tuple[int, ...]) -> tuple[str | None, ...]:
    """The mesh axis (or None) of every dim of the parameter at `path`: its rule's, after leading (scanned layer)
    dims that are replicated; () for a vector (replicated). ValueError for a parameter without a rule."""
    if path[-1] in VECTOR_LEAVES:
        return ()
    name = path[-2] if path[-1] == "kernel" else path[-1]
    rule = PARAM_RULES.get(name)
    if rule is None or len(shape) < len(rule):
        raise ValueError(f"no sharding rule for the parameter {'/'.join(path)} of shape {shape}: name {name!r} "
                         "in sharding.PARAM_RULES with a mesh axis per dim")
    return (None,) * (len(shape) - len(rule)) + rule


def _divides(axis: str | None, size: int, mesh: Mesh) -> bool:
    return axis is None or size % mesh.shape[axis] == 0


def param_spec(path: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
    """The spec of one parameter: its rule's axes, each where it divides the dim."""
    return P(*(axis if _divides(axis, size, mesh) else None for axis, size in zip(_rule(path, shape), shape)))


def unsplit(params, mesh: Mesh) -> list[str]:
    """The parameter dims that their rule's mesh axis does not divide, kept whole on every chip: one entry per
    parameter name and dim, e.g. "embed dim 0 (257) over tensor (2)"."""
    out = []
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = path_keys(path)
        name = keys[-2] if keys[-1] == "kernel" else keys[-1]
        for dim, (axis, size) in enumerate(zip(_rule(keys, x.shape), x.shape)):
            entry = f"{name} dim {dim} ({size}) over {axis} ({mesh.shape.get(axis)})"
            if not _divides(axis, size, mesh) and entry not in out:
                out.append(entry)
    return out


def unsplit_note(dims: list[str]) -> str:
    """How a setting line states `unsplit`'s dims ("" when there are none)."""
    return f"; kept whole, the mesh axis does not divide them: {', '.join(dims)}" if dims else ""


def param_shardings(params, mesh: Mesh):
    """A NamedSharding per leaf of `params` (arrays or ShapeDtypeStructs)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, param_spec(path_keys(path), x.shape, mesh)), params)


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

