"""XLA's cost-model estimate of one train step, assembled from loop-free compiles.

XLA's cost analysis counts the body of a loop once, whatever its trip count, and the train step has two loops:
the microbatch scan and, with scan_layers, the layer scan. So the estimate adds up loop-free pieces, each
compiled for the same devices and mesh as the step:
- the update (`train.step.apply_gradients`), once;
- the gradient of one microbatch (`train.step.make_gradients`, one microbatch), times the microbatch count.
  It is compiled with its layers unrolled, at depth 1 and 2: the layers are identical, so a depth-L model costs
  c(1) + (L − 1)·(c(2) − c(1)) whatever the depth, at the compile time of a two-layer model. The loop over the
  n chunks of a chunked loss is costed the same way: compiled with one and with two chunks per iteration (its
  body then counts twice), the step adds (n − 1) × the difference (halved for an odd n, whose leftover chunk
  also counts).
XLA:TPU's SPMD partitioner turns a matmul whose operand is gathered over a mesh axis (an FSDP-split weight, a
tensor-split activation) into a "windowed einsum": a while loop that overlaps the gather with the matmul piece by
piece. The cost analysis counts one trip of that loop too, which undercounted the FLOPs and time of fsdp and
tensor meshes by up to half. The pieces are therefore compiled with windowed einsum off (`COUNT_EVERY_FLOP`): every
matmul is then a plain one, its gather a separate collective, and the pieces' FLOPs on any mesh equal those on an
all-data mesh. docs/compile.md gives the measurements behind this.
The Pallas attention kernels tell XLA their FLOPs, exponentials and bytes (`flash_attention._cost`), since XLA
cannot look inside them.
The costs are per chip: `flops`, `bytes accessed` and `optimal_seconds`, the last being the time XLA's cost
model predicts. Only XLA:TPU gives them; XLA:GPU returns no cost analysis for a compile-only device.
"""

import dataclasses

import jax

from celerity_jax.accelerators import libtpu_version
from celerity_jax.aot.cache import Cache
from celerity_jax.model import completep, loss, sharding, transformer
from celerity_jax.model.config import ModelConfig
from celerity_jax.train import step as step_lib

COST_KEYS = ("flops", "bytes accessed", "optimal_seconds")


# XLA:TPU's cost model puts −1 s into `optimal_seconds` for each of these custom calls it does not model: seen
# with libtpu 0.0.42, where the total is off by exactly minus their count (ConcatBitcast on v5e; on v5p the
# PrepareAsyncCall pair of each scatter a mixture of experts' step offloads). Added back only for the libtpu
# versions where that was seen; elsewhere a time that comes out negative gives no estimate.
UNMODELED_CALLS = ("ConcatBitcast", "PrepareAsyncCallStart", "PrepareAsyncCallDone")
UNMODELED_CALLS_LIBTPU = ("0.0.42",)

# Compiler options of the cost pieces on TPU: no windowed-einsum loops (see above).
COUNT_EVERY_FLOP = {"xla_tpu_enable_windowed_einsum_for_all_gather": False,
                    "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False}


def _piece_cost(piece: str, lowered, mesh, cache: Cache, target: str) -> dict[str, float] | None:
    """The costs of the cost piece `lowered`, compiled for `mesh`'s devices (with COUNT_EVERY_FLOP on a TPU), or
    read from `cache`."""
    options = COUNT_EVERY_FLOP if mesh.devices.flat[0].platform == "tpu" else {}
    return cache(piece, lowered, target, lambda: costs(lowered.compile(compiler_options=options)), options)


def costs(compiled) -> dict[str, float] | None:
    """The compiled program's per-chip costs, or None when the backend gives none (or no usable time)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else None
    if not analysis or "optimal_seconds" not in analysis:
        return None
    out = {k: float(analysis.get(k, 0.0)) for k in COST_KEYS}
    if libtpu_version().startswith(UNMODELED_CALLS_LIBTPU):
        text = compiled.as_text()
        out["optimal_seconds"] += sum(text.count(f'custom_call_target="{name}"') for name in UNMODELED_CALLS)
    return out if out["optimal_seconds"] > 0 else None


def combine(*terms: tuple[float, dict[str, float]]) -> dict[str, float]:
    """Σ weight·cost over (weight, cost) pairs."""
    return {k: sum(w * c[k] for w, c in terms) for k in COST_KEYS}


def gradient_pieces(model_cfg: ModelConfig, micro_seqs: int, seq_len: int, mesh) -> list[tuple[int, int]]:
    """(n_layers, loss_unroll) of each loop-free gradient compile `gradient_cost` needs."""
    return [(1, 1), (2, 1)] + ([(1, 2)] if _loss_chunks(model_cfg, micro_seqs, seq_len, mesh) > 1 else [])


def gradient_piece(model_cfg: ModelConfig, micro_seqs: int, seq_len: int, mesh, z_loss: float, cache: Cache,
                   target: str, n_layers: int, loss_unroll: int) -> dict[str, float] | None:
    """Per-chip cost of the gradient of one microbatch at depth `n_layers`, layers unrolled, `loss_unroll` loss
    chunks per iteration of its loop."""
    cfg = dataclasses.replace(model_cfg, n_layers=n_layers, scan_layers=False)
    lowered = _lower_gradient(cfg, micro_seqs, seq_len, mesh, z_loss, loss_unroll)
    return _piece_cost("gradient", lowered, mesh, cache, target)


def gradient_cost(model_cfg: ModelConfig, micro_seqs: int, seq_len: int, mesh, z_loss: float, cache: Cache,
                  target: str) -> dict[str, float] | None:
    """Per-chip cost of the gradient of one microbatch of `micro_seqs` sequences, at the model's full depth, on
    `mesh` (whose devices `target` names)."""
    pieces = {piece: gradient_piece(model_cfg, micro_seqs, seq_len, mesh, z_loss, cache, target, *piece)
              for piece in gradient_pieces(model_cfg, micro_seqs, seq_len, mesh)}
    if None in pieces.values():
        return None
    one, two = pieces[(1, 1)], pieces[(2, 1)]
    total = combine((1.0, one), (model_cfg.n_layers - 1, two), (1 - model_cfg.n_layers, one))
    chunks = _loss_chunks(model_cfg, micro_seqs, seq_len, mesh)
    if chunks == 1:
        return total
    # The loop over loss chunks, counted once, runs `chunks` times. With two chunks per iteration its body counts
    # twice, plus once more for the leftover chunk of an odd count.
    per_chunk = combine((1.0 / (1 + chunks % 2), pieces[(1, 2)]), (-1.0 / (1 + chunks % 2), one))
    return combine((1.0, total), (chunks - 1, per_chunk))


def _loss_chunks(model_cfg: ModelConfig, micro_seqs: int, seq_len: int, mesh) -> int:
    return seq_len // loss.logits_chunk_len(model_cfg.logits_chunk_len, sharding.local_batch(micro_seqs, mesh),
                                            seq_len, model_cfg.vocab_size)


def _lower_gradient(model_cfg: ModelConfig, micro_seqs: int, seq_len: int, mesh, z_loss: float, loss_unroll: int = 1):
    abstract = jax.eval_shape(lambda: transformer.init_params(model_cfg, jax.random.key(0)))
    param_sh = sharding.param_shardings(transformer.declarations(model_cfg), abstract, mesh)
    batch_sh = sharding.batch_sharding(mesh)
    gradients = jax.jit(step_lib.make_gradients(model_cfg, microbatches=1, z_loss=z_loss, loss_unroll=loss_unroll),
                        in_shardings=(param_sh, batch_sh), out_shardings=(param_sh, None))
    params = sharding.with_shardings(abstract, param_sh)
    tokens = jax.ShapeDtypeStruct((micro_seqs, seq_len), "int32", sharding=batch_sh)
    with jax.set_mesh(mesh):
        return gradients.lower(params, {"inputs": tokens, "targets": tokens})


def update_cost(build: step_lib.StepBuild, plan, mesh, cache: Cache, target: str) -> dict[str, float] | None:
    """Per-chip cost of the update of one step (optimizer, non-finite guard, monitor, metrics)."""
    state_sh, replicated = build.state_shardings, sharding.replicated(mesh)
    roles = completep.multipliers(build.model_cfg, transformer.declarations(build.model_cfg)).role
    update = jax.jit(lambda state, grads, ce: step_lib.apply_gradients(plan, build.optimizer, roles, state, grads, ce),
                     in_shardings=(state_sh, state_sh.params, replicated), out_shardings=(state_sh, None))
    state, _ = build.abstract_inputs(plan.batch_seqs, plan.seq_len)
    lowered = update.lower(state, state.params, jax.ShapeDtypeStruct((), "float32", sharding=replicated))
    return _piece_cost("update", lowered, mesh, cache, target)
