import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from celerity_jax import optim, recipe, schedules
from celerity_jax.model import completep, presets, transformer
from celerity_jax.model.config import ModelConfig

M_D = 4.0  # width multiplier of the hand-made model: hidden LR and eps are 1/m_d of the base


class Mults(NamedTuple):
    """Stands in for completep.Multipliers: pytrees mirroring the params."""
    role: Any
    lr: Any
    eps: Any
    decay: Any


def _params():
    return {"embed": jnp.full((8, 4), 0.5), "block": {"kernel": jnp.full((4, 4), -2.0),
                                                      "scale": jnp.ones((4,))}}


MULTS = Mults(role={"embed": completep.Role.EMBEDDING,
                    "block": {"kernel": completep.Role.HIDDEN, "scale": completep.Role.BLOCK_VECTOR}},
              lr={"embed": 1.0, "block": {"kernel": 1 / M_D, "scale": 1.0}},
              eps={"embed": 1 / M_D, "block": {"kernel": 0.5 / M_D, "scale": 0.5 / M_D}},
              decay={"embed": True, "block": {"kernel": True, "scale": False}})


def _plan(steps=100, warmup_steps=10, schedule="d2z", tau=0.2, base_lr=0.1, adam_eps=1e-8,
          grad_clip=0.0) -> recipe.Plan:
    batch_tokens = 64
    lr_hidden = base_lr / M_D
    weight_decay = recipe.weight_decay_for_tau(batch_tokens, lr_hidden, tau, steps * batch_tokens)
    return recipe.Plan(
        n_params=1000, tpp=steps * batch_tokens / 1000, tokens=steps * batch_tokens, steps=steps,
        batch_seqs=4, batch_tokens=batch_tokens, seq_len=16, warmup_steps=warmup_steps,
        schedule=schedule, wsd_decay_frac=0.2, base_lr=base_lr, lr_hidden=lr_hidden,
        lr_peak={"embedding": base_lr, "hidden": lr_hidden}, weight_decay=weight_decay, tau=tau,
        decay_convention="per_lr", weight_decay_mult={"embedding": 1.0, "hidden": 1.0, "block_vector": 0.0},
        tau_by_role={"embedding": tau / M_D, "hidden": tau},
        adam_b1=0.9, adam_b2=0.95, adam_eps=adam_eps, grad_clip=grad_clip, flops_per_token=6000.0,
        train_flops=6000.0 * steps * batch_tokens, bands=())


def _run_zero_grads(plan, steps):
    """Stacked params (θ_0 first) and optimizer metrics of `steps` updates with zero gradients."""
    opt = optim.build_optimizer(plan, MULTS)

    def step(carry, _):
        params, state = carry
        updates, state = opt.update(jax.tree.map(jnp.zeros_like, params), state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        return (params, state), (params, optim.optimizer_metrics(plan, state))

    params = _params()
    run = jax.jit(lambda p: jax.lax.scan(step, (p, opt.init(p)), length=steps)[1])
    params_T, metrics_T = run(params)
    params_T = jax.tree.map(lambda p0, p: np.concatenate([p0[None], p]), params, params_T)
    return params_T, jax.tree.map(np.asarray, metrics_T)


def _lr_hidden_T(plan, steps):
    s = schedules.make_schedule(plan.schedule, plan.steps, plan.warmup_steps)
    return plan.lr_hidden * np.asarray(s(np.arange(steps)), np.float64)


def test_hidden_matrix_decays_by_lr_hidden_times_lambda_each_step():
    plan = _plan()
    params_T, metrics_T = _run_zero_grads(plan, plan.steps)
    lr_T = _lr_hidden_T(plan, plan.steps)
    np.testing.assert_allclose(metrics_T["lr"], lr_T, rtol=1e-5, atol=1e-12)
    kernel_T = params_T["block"]["kernel"][:, 0, 0]  # every entry starts, and stays, equal
    embed_T = params_T["embed"][:, 0, 0]
    np.testing.assert_allclose(kernel_T[1:] / kernel_T[:-1], 1 - lr_T * plan.weight_decay, rtol=1e-6)
    # The embedding's LR multiplier is m_d times the hidden one, and so is its decay rate.
    np.testing.assert_allclose(embed_T[1:] / embed_T[:-1], 1 - M_D * lr_T * plan.weight_decay,
                               rtol=1e-6)
    np.testing.assert_array_equal(params_T["block"]["scale"], 1.0)  # norm gains do not decay


def test_zero_gradients_give_product_of_decays():
    plan = _plan(steps=150, warmup_steps=15, schedule="cosine")
    params_T, _ = _run_zero_grads(plan, plan.steps)
    expected = np.prod(1 - _lr_hidden_T(plan, plan.steps) * plan.weight_decay) * -2.0
    np.testing.assert_allclose(params_T["block"]["kernel"][-1], expected, rtol=1e-5)


def test_ema_timescale_in_steps_is_tau_times_T():
    plan = _plan(steps=200, warmup_steps=0, schedule="constant", tau=0.25)
    params_T, metrics_T = _run_zero_grads(plan, plan.steps)
    kernel_T = params_T["block"]["kernel"][:, 0, 0] / -2.0
    e_folding_steps = int(np.argmax(kernel_T <= np.exp(-1)))
    assert e_folding_steps == pytest.approx(plan.tau * plan.steps, abs=1)  # 50 steps
    np.testing.assert_allclose(metrics_T["tau"], plan.tau, rtol=1e-5)
    np.testing.assert_allclose(metrics_T["weight_decay"], plan.weight_decay, rtol=1e-6)


def test_instantaneous_tau_grows_as_lr_decays():
    plan = _plan(steps=100, warmup_steps=10)
    taus = _run_zero_grads(plan, 60)[1]["tau"]
    assert taus[10] == pytest.approx(plan.tau, rel=1e-5)  # the peak step
    np.testing.assert_allclose(taus[10:], plan.tau * 90 / (100 - np.arange(10, 60)), rtol=1e-5)


def test_first_update_uses_per_leaf_eps_and_lr_multipliers():
    plan = _plan(warmup_steps=0, adam_eps=0.2)  # an eps this large makes its per-leaf value visible
    params = _params()
    grads = {"embed": jnp.full((8, 4), 0.1), "block": {"kernel": jnp.full((4, 4), -0.3),
                                                       "scale": jnp.full((4,), 0.05)}}
    updates = _first_update(plan, grads)
    for leaf in (("embed",), ("block", "kernel"), ("block", "scale")):
        pick = lambda tree: _get(tree, leaf)
        g, eps = pick(grads), plan.adam_eps * pick(MULTS.eps)
        # First Adam step: bias-corrected m̂ = g, v̂ = g², so the direction is g/(|g| + eps).
        expected = -plan.base_lr * pick(MULTS.lr) * (
            g / (jnp.abs(g) + eps) + plan.weight_decay * pick(params) * pick(MULTS.decay))
        np.testing.assert_allclose(pick(updates), expected, rtol=1e-5)


def test_global_norm_clipping():
    grads = jax.tree.map(lambda p: jnp.full_like(p, 3.0), _params())
    norm = float(jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))))
    eps = 1.0 * MULTS.eps["block"]["scale"]  # the norm gain does not decay: update = −lr·g/(|g|+eps)
    for clip, g in ((1.0, 3.0 / norm), (0.0, 3.0)):
        plan = _plan(warmup_steps=0, adam_eps=1.0, grad_clip=clip)
        np.testing.assert_allclose(_first_update(plan, grads)["block"]["scale"],
                                   -plan.base_lr * g / (g + eps), rtol=1e-5)


def _first_update(plan, grads):
    opt = optim.build_optimizer(plan, MULTS)
    params = _params()
    return jax.jit(opt.update)(grads, opt.init(params), params)[0]


def _get(tree, keys):
    for k in keys:
        tree = tree[k]
    return tree


def test_per_lr_decay_is_optax_add_decayed_weights_bit_for_bit():
    """The default convention is the chain this optimizer had before conventions were selectable."""
    plan = _plan(warmup_steps=0, grad_clip=1.0)
    ones = jax.tree.map(lambda _: 1.0, MULTS.decay)
    ours = optim.tau_pinned_adamw(plan.base_lr, plan.weight_decay, b1=0.9, b2=0.95, eps=MULTS.eps,
                                  lr_multipliers=MULTS.lr, decay_mask=MULTS.decay, grad_clip=1.0,
                                  decay_scales=ones)
    before = optax.chain(optax.clip_by_global_norm(1.0), optim.scale_by_adam_per_leaf_eps(0.9, 0.95, MULTS.eps),
                         optax.add_decayed_weights(plan.weight_decay, mask=MULTS.decay),
                         optim.scale_by_tree(MULTS.lr), optax.scale_by_learning_rate(plan.base_lr))
    params_by_opt, states = {}, {}
    for name, opt in (("ours", ours), ("before", before)):
        params, state = _params(), opt.init(_params())
        for i in range(3):
            grads = jax.tree.map(lambda p: jnp.sin(p + i), params)
            updates, state = jax.jit(opt.update)(grads, state, params)
            params = optax.apply_updates(params, updates)
        params_by_opt[name], states[name] = params, state
    jax.tree.map(np.testing.assert_array_equal, params_by_opt["ours"], params_by_opt["before"])
    assert jax.tree.structure(states["ours"]) == jax.tree.structure(states["before"])  # checkpoints still load


# m_d = 128/32 = 4, m_L = 4/1 = 4; learned positions and biases, so that every role has leaves.
ROLES_CFG = ModelConfig(n_layers=4, d_model=128, n_heads=8, head_dim=16, vocab_size=64, max_seq_len=32, d_base=32,
                        n_layers_base=1, positions="learned", use_bias=True)


@pytest.mark.parametrize("convention, alpha, hidden_decay", [
    ("per_lr", 1.0, 0.0125),  # η_base·λ/m_d
    ("width_scaled", 1.0, 0.05),  # η_base·λ, the embeddings' rate
    ("per_lr", 0.5, 0.00625),  # η_base·λ·m_L^(α−1)/m_d
    ("width_scaled", 0.5, 0.025),  # η_base·λ·m_L^(α−1)
])
def test_one_update_decays_each_role_at_the_documented_rate(convention, alpha, hidden_decay):
    cfg = dataclasses.replace(ROLES_CFG, depth_alpha=alpha)
    plan = recipe.make_plan(cfg, recipe.RecipeConfig(
        tpp=1, seq_len=16, batch_seqs=4, base_lr=0.1, weight_decay=0.5, schedule="constant", warmup_frac=0.0,
        warmup_tokens=None, decay_convention=convention))
    # Per-step decay η_base·lr_mult·c·λ with η_base = 0.1 and λ = 0.5; norm gains and biases do not decay.
    decay = {"embedding": 0.05, "hidden": hidden_decay, "block_vector": 0.0, "final_norm": 0.0, "unembedding": 0.05}
    params = transformer.init_params(cfg, jax.random.key(0))
    optimizer = optim.build_optimizer(plan, completep.multipliers(cfg, transformer.declarations(cfg)))
    updates, state = optimizer.update(jax.tree.map(jnp.zeros_like, params), optimizer.init(params), params)
    theta = optax.apply_updates(params, updates)
    roles = jax.tree.leaves(completep.multipliers(cfg, transformer.declarations(cfg)).role)
    for role, before, after in zip(roles, jax.tree.leaves(params), jax.tree.leaves(theta)):
        np.testing.assert_allclose(after, before * (1 - decay[role.value]), rtol=1e-6, err_msg=role.value)
    assert {r.value for r in roles} == set(decay)
    assert plan.tau == pytest.approx(plan.batch_tokens / (hidden_decay * plan.tokens), rel=1e-12)
    assert float(optim.optimizer_metrics(plan, state)["tau"]) == pytest.approx(plan.tau, rel=1e-6)


@pytest.mark.parametrize("convention", completep.DECAY_CONVENTIONS)
def test_real_model_hidden_matrices_decay_at_one_over_tau_T_under_each_convention(convention):
    cfg = presets.preset("tiny-d64")  # m_d = 2
    plan = recipe.make_plan(cfg, recipe.RecipeConfig(tpp=2, seq_len=64, batch_seqs=16, base_lr=1e-2,
                                                      warmup_tokens=None, decay_convention=convention))
    params = transformer.init_params(cfg, jax.random.key(0))
    optimizer = optim.build_optimizer(plan, completep.multipliers(cfg, transformer.declarations(cfg)))
    state = optimizer.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    update = jax.jit(optimizer.update)
    theta = params
    for _ in range(50):
        updates, state = update(zeros, state, theta)
        theta = optax.apply_updates(theta, updates)
    schedule = schedules.make_schedule(plan.schedule, plan.steps, plan.warmup_steps, plan.wsd_decay_frac)
    # λ is derived so that the hidden matrices' peak decay per step is 1/(τ·T) whatever the convention.
    expected = np.prod([1 - float(schedule(j)) / (plan.tau * plan.steps) for j in range(50)])
    hidden = theta["block_0"]["mlp"]["up"]["kernel"] / params["block_0"]["mlp"]["up"]["kernel"]
    np.testing.assert_allclose(np.asarray(hidden), expected, rtol=1e-5)
    assert expected < 0.999  # the decay is visible
