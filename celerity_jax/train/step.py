"""The train state and the jitted train and eval steps (built by closures, state donated)."""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from celerity_jax import optim
from celerity_jax.collapse import monitor as monitor_lib
from celerity_jax.model import completep, loss, sharding, transformer
from celerity_jax.model.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    step: jax.Array  # int32: steps taken so far, skipped bad steps included
    params: Any
    opt_state: Any
    monitor: Any  # the collapse monitor's binned curve
    bad_steps: jax.Array  # int32: steps whose loss was not finite (their update was skipped)
    first_bad_step: jax.Array  # int32: the first such step, -1 if none


def init_state(model_cfg: ModelConfig, optimizer: optax.GradientTransformation, monitor_cfg, rng) -> TrainState:
    params = transformer.init_params(model_cfg, rng)
    return TrainState(step=jnp.zeros([], jnp.int32), params=params, opt_state=optimizer.init(params),
                      monitor=monitor_lib.monitor_init(monitor_cfg), bad_steps=jnp.zeros([], jnp.int32),
                      first_bad_step=jnp.full([], -1, jnp.int32))


def state_shardings(model_cfg: ModelConfig, abstract_state: TrainState, mesh,
                    optimizer: optax.GradientTransformation) -> TrainState:
    """A NamedSharding for every leaf of the train state (rules in `celerity_jax/model/sharding.py`)."""
    param_sh = sharding.param_shardings(transformer.declarations(model_cfg), abstract_state.params, mesh)
    rep = sharding.replicated(mesh)
    return TrainState(step=rep, params=param_sh,
                      opt_state=sharding.opt_state_shardings(optimizer, abstract_state.opt_state, param_sh, mesh),
                      monitor=jax.tree.map(lambda _: rep, abstract_state.monitor),
                      bad_steps=rep, first_bad_step=rep)


def loss_metrics(model_cfg: ModelConfig, terms: dict) -> dict[str, jax.Array]:
    """The scalars of a loss's terms (`transformer.next_token_loss`) that a step logs: train/loss, the
    cross-entropy; with n_experts > 1 also moe/dropped (the fraction of routes dropped, mean over layers),
    moe/load_max (E × the largest share of routes an expert takes before drops, in the most unbalanced layer: 1
    when balanced) and, for router "topk", moe/router_aux (the Switch load-balancing loss, mean over layers)."""
    out = {"train/loss": terms["cross_entropy"]}
    if model_cfg.n_experts > 1:
        out["moe/dropped"] = terms["dropped"]
        out["moe/load_max"] = model_cfg.n_experts * jnp.max(terms["expert_load"])
        if model_cfg.router == "topk":
            out["moe/router_aux"] = terms["router_aux"]
    return out


def make_loss(model_cfg: ModelConfig, z_loss: float, loss_unroll: int = 1):
    """(params, batch) -> (the loss to differentiate, its `loss_metrics`)."""
    def loss_fn(params, batch):
        total, terms = transformer.next_token_loss(model_cfg, params, batch["inputs"], batch["targets"],
                                                   z_loss=z_loss, loss_unroll=loss_unroll)
        return total, loss_metrics(model_cfg, terms)
    return loss_fn


def _grads(loss_fn, params, batch, microbatches: int):
    """Mean gradient and mean loss metrics over `microbatches` equal slices of the batch."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if microbatches == 1:
        (_, losses), grads = grad_fn(params, batch)
        return grads, losses

    def split(x_BxL):
        b = x_BxL.shape[0]  # rows i, i+M, i+2M, ... form microbatch i, so each keeps its batch sharding
        return x_BxL.reshape(b // microbatches, microbatches, *x_BxL.shape[1:]).swapaxes(0, 1)

    def body(carry, micro):
        (_, losses), grads = grad_fn(params, micro)
        return jax.tree.map(jnp.add, carry, (grads, losses)), None

    micro_batches = jax.tree.map(split, batch)
    losses_shape = jax.eval_shape(loss_fn, params, jax.tree.map(lambda x: x[0], micro_batches))[1]
    zeros = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), losses_shape))
    (grads, losses), _ = jax.lax.scan(body, zeros, micro_batches)
    return jax.tree.map(lambda x: x / microbatches, (grads, losses))


def _role_ratios(roles, updates, params) -> dict[str, jax.Array]:
    """Per CompleteP role: RMS of the update over RMS of the parameters; `roles`: a tree of Role mirroring them."""
    out = {}
    for role in completep.Role:
        picked = [(u, p) for r, u, p in zip(jax.tree.leaves(roles), jax.tree.leaves(updates),
                                             jax.tree.leaves(params)) if r is role]
        if picked:
            u2 = sum(jnp.sum(jnp.square(u)) for u, _ in picked)
            p2 = sum(jnp.sum(jnp.square(p)) for _, p in picked)
            out[f"opt/update_rms_ratio/{role.value}"] = jnp.sqrt(u2 / jnp.maximum(p2, 1e-30))
    return out


def _skip_keeping_counts(new_opt_state, old_opt_state, finite):
    """On a skipped step, moments stay as they were but step counters advance, so the LR schedule
    stays aligned with t̂ = step / T."""
    def pick(path, new, old):
        is_count = getattr(path[-1], "name", None) == "count"
        return new if is_count else jnp.where(finite, new, old)
    return jax.tree_util.tree_map_with_path(pick, new_opt_state, old_opt_state)


def apply_gradients(plan, optimizer: optax.GradientTransformation, roles, state: TrainState, grads, ce,
                    monitor_train_loss: bool = True):
    """The update from the mean gradient and cross-entropy of a step: (state, metrics). `roles`: the parameters'
    CompleteP roles (`completep.multipliers(...).role`), for the per-role update ratios.

    A non-finite loss or gradient leaves params and optimizer moments untouched. `monitor_train_loss`: the
    collapse monitor follows the training loss (else the eval loss, added by `monitor_eval_loss`)."""
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(ce) & jnp.isfinite(optax.tree.norm(grads))
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
    step = state.step + 1
    new_state = TrainState(
        step=step,
        params=keep(params, state.params),
        opt_state=_skip_keeping_counts(opt_state, state.opt_state, finite),
        monitor=monitor_lib.monitor_update(state.monitor, ce, step / plan.steps) if monitor_train_loss
        else state.monitor,
        bad_steps=state.bad_steps + (~finite).astype(jnp.int32),
        first_bad_step=jnp.where((state.first_bad_step < 0) & ~finite, step, state.first_bad_step))
    metrics = {"train/loss": ce, "opt/grad_norm": optax.tree.norm(grads),
               "opt/param_norm": optax.tree.norm(new_state.params)}
    metrics.update({f"opt/{k}": v for k, v in optim.optimizer_metrics(plan, opt_state).items()})
    metrics.update(_role_ratios(roles, updates, state.params))
    return new_state, metrics


def make_gradients(model_cfg: ModelConfig, *, microbatches: int, z_loss: float, loss_unroll: int = 1) -> Callable:
    """(params, batch) -> (mean gradient, mean `loss_metrics`) over `microbatches` slices of the batch.
    loss_unroll: loss chunks per iteration of the loop over them (`transformer.next_token_loss`), for XLA's cost
    analysis."""
    loss_fn = make_loss(model_cfg, z_loss, loss_unroll)
    return lambda params, batch: _grads(loss_fn, params, batch, microbatches)


def make_train_step(model_cfg: ModelConfig, plan, optimizer: optax.GradientTransformation, *,
                    microbatches: int, z_loss: float, state_shardings=None, batch_sharding=None,
                    monitor_train_loss: bool = True) -> Callable:
    """(state, batch) -> (state, metrics: `apply_gradients`'s and the batch's `loss_metrics`). A non-finite loss
    leaves params and optimizer untouched."""
    gradients = make_gradients(model_cfg, microbatches=microbatches, z_loss=z_loss)
    roles = completep.multipliers(model_cfg, transformer.declarations(model_cfg)).role

    def train_step(state: TrainState, batch) -> tuple[TrainState, dict[str, jax.Array]]:
        grads, losses = gradients(state.params, batch)
        state, metrics = apply_gradients(plan, optimizer, roles, state, grads, losses["train/loss"],
                                         monitor_train_loss)
        return state, {**metrics, **losses}

    return jax.jit(train_step, donate_argnums=0, in_shardings=(state_shardings, batch_sharding),
                   out_shardings=(state_shardings, None))


@dataclasses.dataclass(frozen=True)
class StepBuild:
    """What `celerity train` runs, built once for a mesh: shared by the trainer and `celerity compile`."""

    model_cfg: ModelConfig
    microbatches: int
    mesh: Any
    optimizer: optax.GradientTransformation
    abstract_state: TrainState  # ShapeDtypeStructs
    state_shardings: TrainState
    batch_sharding: Any
    train_step: Callable  # jitted, state donated
    init: Callable  # () -> the initial TrainState, laid out with state_shardings

    def abstract_inputs(self, batch_seqs: int, seq_len: int):
        """ShapeDtypeStructs (with shardings) of the train step's (state, batch), for ahead-of-time lowering."""
        state = sharding.with_shardings(self.abstract_state, self.state_shardings)
        tokens = jax.ShapeDtypeStruct((batch_seqs, seq_len), jnp.int32, sharding=self.batch_sharding)
        return state, {"inputs": tokens, "targets": tokens}

    def lower(self, batch_seqs: int, seq_len: int):
        """The train step lowered ahead of time, traced under the mesh (activations keep their batch sharding)."""
        with jax.set_mesh(self.mesh):
            return self.train_step.lower(*self.abstract_inputs(batch_seqs, seq_len))

    def setting(self, plan) -> dict:
        """How the step trades memory for speed, each "auto" choice resolved, and the parameter and activation dims
        kept whole (`sharding.unsplit`, `unsplit_activations`): what `setting_line` states, and what
        `celerity compile` reports."""
        cfg = self.model_cfg
        local_seqs = sharding.local_batch(plan.batch_seqs // self.microbatches, self.mesh)
        return {"mesh_shape": [self.mesh.shape[axis] for axis in sharding.MESH_AXES],
                "microbatches": self.microbatches, "remat": cfg.remat, "scan_layers": cfg.scan_layers,
                "compute_dtype": cfg.dtype, "residual_dtype": cfg.residual, "attention_impl": cfg.attention_kernel,
                "dense_backward": cfg.dense_backward_kernel,
                "logits_chunk_len": loss.logits_chunk_len(cfg.logits_chunk_len, local_seqs, plan.seq_len,
                                                          cfg.vocab_size),
                "seq_len": plan.seq_len,
                "unsplit": (sharding.unsplit(transformer.declarations(cfg), self.abstract_state.params, self.mesh)
                            + sharding.unsplit_activations(cfg, plan.batch_seqs // self.microbatches, plan.seq_len,
                                                           self.mesh))}


def build_step(model_cfg: ModelConfig, plan, monitor_cfg, mesh, *, microbatches: int, z_loss: float,
               seed: int) -> StepBuild:
    """The optimizer, the sharded train state and the jitted train step of a run on `mesh`."""
    rng = jax.random.key(seed)
    multipliers = completep.multipliers(model_cfg, transformer.declarations(model_cfg))
    optimizer = optim.build_optimizer(plan, multipliers)
    init = lambda: init_state(model_cfg, optimizer, monitor_cfg, rng)  # noqa: E731
    abstract = jax.eval_shape(init)
    state_sh = state_shardings(model_cfg, abstract, mesh, optimizer)
    batch_sh = sharding.batch_sharding(mesh)
    train_step = make_train_step(model_cfg, plan, optimizer, microbatches=microbatches, z_loss=z_loss,
                                 state_shardings=state_sh, batch_sharding=batch_sh,
                                 monitor_train_loss=monitor_cfg.loss_curve == "train")
    return StepBuild(model_cfg=model_cfg, microbatches=microbatches, mesh=mesh, optimizer=optimizer,
                     abstract_state=abstract, state_shardings=state_sh,
                     batch_sharding=batch_sh, train_step=train_step, init=jax.jit(init, out_shardings=state_sh))


def setting_line(setting: dict) -> str:
    """A step's setting (`StepBuild.setting`, or a compile report holding it) in one line."""
    chunk = setting["logits_chunk_len"]
    return (f"mesh (data, fsdp, tensor) {tuple(setting['mesh_shape'])}, {setting['microbatches']} microbatches, "
            f"remat {setting['remat']}, scan_layers {setting['scan_layers']}, {setting['compute_dtype']} "
            f"(residual {setting['residual_dtype']}), "
            f"attention {setting['attention_impl']}, "
            + (f"loss in chunks of {chunk} positions" if chunk < setting["seq_len"] else "whole logits")
            + sharding.unsplit_note(setting["unsplit"]))


def monitor_eval_loss(state: TrainState, eval_loss: float, frac: float) -> TrainState:
    """The state with one eval's loss at t̂ = `frac` added to the collapse monitor's curve
    (MonitorConfig.loss_curve = "eval"); only the monitor's small arrays are touched."""
    return dataclasses.replace(state, monitor=monitor_lib.monitor_update(state.monitor, np.float32(eval_loss),
                                                                         np.float32(frac)))


def make_eval_step(model_cfg: ModelConfig, batch_sharding=None, param_shardings=None) -> Callable:
    """(params, batch) -> mean cross-entropy (a mixture's router terms left out, as from train/loss)."""
    loss_fn = make_loss(model_cfg, 0.0)
    return jax.jit(lambda params, batch: loss_fn(params, batch)[1]["train/loss"],
                   in_shardings=(param_shardings, batch_sharding))
