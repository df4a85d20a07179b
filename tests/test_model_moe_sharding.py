"""Expert parallelism: a mixture's experts split over fsdp, its tokens moved to them by all-to-all, and the loss
and update of one device."""

import dataclasses
import textwrap

import jax
import pytest
from jax.sharding import PartitionSpec as P

from celerity_jax.model import sharding, transformer
from celerity_jax.model.config import ModelConfig

TINY = ModelConfig(n_layers=1, d_model=32, n_heads=2, head_dim=16, vocab_size=64, max_seq_len=16, d_base=16,
                   n_layers_base=1, n_experts=4, experts_per_token=2)
DISPATCHED = ("expert", "batch", None, "activation_embed")  # tokens at their experts, [E, B, C, D]


def _fake_mesh(shape):
    class FakeMesh:  # logical_spec only reads axis sizes
        pass
    mesh = FakeMesh()
    mesh.shape = dict(zip(sharding.MESH_AXES, shape))
    return mesh


def _mixture_specs(cfg, mesh_shape):
    declared = transformer.declarations(cfg)
    shapes = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    specs = jax.tree.map(lambda d, x: sharding.logical_spec(d.axes, x.shape, _fake_mesh(mesh_shape)), declared, shapes)
    return specs["block_0"]["mlp"], sharding.unsplit(declared, shapes, _fake_mesh(mesh_shape))


def test_experts_take_fsdp_and_their_weights_embed_dim_stays_whole():
    specs, unsplit = _mixture_specs(TINY, (2, 4, 2))
    assert specs["experts"]["up"]["kernel"] == P("fsdp", None, "tensor")
    assert specs["experts"]["down"]["kernel"] == P("fsdp", "tensor", None)
    assert specs["router"] == P("fsdp", None)  # the embed dim comes first and takes fsdp
    assert unsplit == []
    assert sharding.logical_spec(DISPATCHED, (4, 8, 10, 32), _fake_mesh((2, 4, 2))) == P("fsdp", "data", None, None)
    # more fsdp chips than experts: the experts stay whole and the weights split as a dense MLP's
    specs, unsplit = _mixture_specs(TINY, (1, 8, 1))
    assert specs["experts"]["up"]["kernel"] == P(None, "fsdp", "tensor") and unsplit == ["expert (4) over fsdp (8)"]
    assert sharding.logical_spec(DISPATCHED, (4, 8, 10, 32), _fake_mesh((1, 8, 1))) == P(None, ("data", "fsdp"),
                                                                                        None, None)


def test_without_expert_parallelism_every_chip_holds_every_expert_split_as_a_dense_mlp():
    specs, _ = _mixture_specs(dataclasses.replace(TINY, expert_parallel=False), (2, 4, 2))
    assert specs["experts"]["up"]["kernel"] == P(None, "fsdp", "tensor")
    assert specs["experts"]["down"]["kernel"] == P(None, "tensor", "fsdp")


def test_scanned_layers_split_their_stacked_experts_over_fsdp():
    declared = transformer.declarations(dataclasses.replace(TINY, scan_layers=True))
    axes = declared["blocks"]["mlp"]["experts"]["up"]["kernel"].axes
    assert axes == ("layers", "expert", "embed", "mlp")
    assert sharding.logical_spec(axes, (1, 4, 32, 256), _fake_mesh((2, 4, 2))) == P(None, "fsdp", None, "tensor")


# One train step of a tiny mixture on 1 device and on an expert-parallel mesh of 8 CPU devices; the mesh's step
# must move each layer's dispatched tokens by all-to-all: there and back, forward and backward.
STEP_ON_EIGHT_DEVICES = """
    import jax, numpy as np
    from celerity_jax import gin_config, recipe
    from celerity_jax.model import sharding
    from celerity_jax.train import step as step_lib

    def one_step(mesh_shape, devices, *bindings):
        configs = gin_config.parse_gin({tiny_gin!r}, ["ModelConfig.n_experts = 4", "RecipeConfig.seq_len = 16",
                                                     *bindings])
        plan = recipe.make_plan(configs.model, configs.recipe)
        build = step_lib.build_step(configs.model, plan, configs.monitor, sharding.make_mesh(mesh_shape, devices),
                                    microbatches=1, z_loss=0.0, seed=0)
        tokens = jax.random.randint(jax.random.key(0), (plan.batch_seqs, 16), 0, 257)
        with jax.set_mesh(build.mesh):
            step = build.train_step.lower(*build.abstract_inputs(plan.batch_seqs, 16)).compile()
        state, metrics = step(build.init(), jax.device_put({{"inputs": tokens, "targets": tokens}},
                                                           build.batch_sharding))
        moves = sum(" all-to-all(" in line and "mlp/sharding_constraint" in line
                    for line in step.as_text().splitlines())
        return float(metrics["train/loss"]), state, moves

    for mesh_shape, bindings in {cases!r}:
        want, want_state, _ = one_step((1, 1, 1), jax.devices()[:1], *bindings)
        got, got_state, moves = one_step(mesh_shape, None, *bindings)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        # the parameters after the update, and Adam's moments: the first is (1 - b1) x the gradient
        for a, b in zip(jax.tree.leaves((got_state.params, got_state.opt_state)),
                        jax.tree.leaves((want_state.params, want_state.opt_state))):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), (bindings, np.max(np.abs(a - b)))
        parallel = "ModelConfig.expert_parallel = False" not in bindings
        assert moves == (4 * 2 if parallel else 0), (mesh_shape, bindings, moves)
    print("ok")
"""


def test_on_eight_devices_an_expert_parallel_top2_step_matches_one_device(on_eight_devices, tiny_gin):
    cases = [((1, 4, 2), ("ModelConfig.experts_per_token = 2",))]
    assert "ok" in on_eight_devices(textwrap.dedent(STEP_ON_EIGHT_DEVICES.format(tiny_gin=tiny_gin, cases=cases)))


@pytest.mark.slow  # 20 s
def test_on_eight_devices_hash_routing_and_dense_dispatch_match_one_device(on_eight_devices, tiny_gin):
    cases = [((2, 4, 1), ("ModelConfig.router = 'hash'",)),
             ((1, 4, 2), ("ModelConfig.experts_per_token = 2", "ModelConfig.expert_parallel = False"))]
    assert "ok" in on_eight_devices(textwrap.dedent(STEP_ON_EIGHT_DEVICES.format(tiny_gin=tiny_gin, cases=cases)))
