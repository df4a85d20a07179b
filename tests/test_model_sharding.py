import dataclasses
import textwrap

import jax
import pytest
from jax.sharding import PartitionSpec as P

from celerity_jax.errors import ConfigError
from celerity_jax.model import presets, sharding, transformer


def _fake_mesh(shape):
    class FakeMesh:  # param_spec only reads axis sizes
        pass
    mesh = FakeMesh()
    mesh.shape = dict(zip(sharding.MESH_AXES, shape))
    return mesh


def _declared(cfg):
    return transformer.declarations(cfg), jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))


def test_param_specs_follow_the_declared_axes():
    mesh = _fake_mesh((2, 2, 2))
    cfg = dataclasses.replace(presets.preset("tiny-d32"), vocab_size=256, use_bias=True, n_kv_heads=1)
    declared, shapes = _declared(cfg)
    specs = jax.tree.map(lambda d, x: sharding.logical_spec(d.axes, x.shape, mesh), declared, shapes)
    assert specs["embed"] == P("tensor", "fsdp")
    assert specs["unembed"] == P("fsdp", "tensor")
    assert specs["block_0"]["attn"]["q"]["kernel"] == P("fsdp", "tensor")
    assert specs["block_0"]["attn"]["q"]["bias"] == P("tensor")
    assert specs["block_0"]["attn"]["k"]["kernel"] == P("fsdp", "tensor")  # 1 kv head × 16 = 16 divides
    assert specs["block_0"]["mlp"]["down"]["kernel"] == P("tensor", "fsdp")
    assert specs["block_0"]["attn_norm"]["scale"] == P(None)
    scanned = dataclasses.replace(cfg, scan_layers=True)
    declared, shapes = _declared(scanned)
    assert declared["blocks"]["mlp"]["up"]["kernel"].axes == ("layers", "embed", "mlp")
    assert sharding.logical_spec(declared["blocks"]["mlp"]["up"]["kernel"].axes,
                                 shapes["blocks"]["mlp"]["up"]["kernel"].shape, mesh) == P(None, "fsdp", "tensor")


def test_indivisible_dims_stay_whole():
    mesh = _fake_mesh((1, 8, 2))
    assert sharding.logical_spec(("embed", "vocab"), (36, 259), mesh) == P(None, None)
    assert sharding.logical_spec(sharding.RESIDUAL_AXES, (16, 7, 64), mesh) == P(("data", "fsdp"), None, None)


def test_every_parameter_gets_a_spec():
    cfg = presets.preset("tiny-d32")
    declared, shapes = _declared(cfg)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    shardings = sharding.param_shardings(declared, shapes, mesh)
    assert jax.tree.structure(shardings) == jax.tree.structure(shapes)


def test_bad_mesh_shapes_are_refused():
    with pytest.raises(ConfigError, match="devices"):
        sharding.make_mesh((3, 1, 1), jax.devices()[:1] * 1)
    mesh = sharding.make_mesh((-1, 1, 1), jax.devices()[:1])
    with pytest.raises(ConfigError, match="microbatches"):
        sharding.check_batch_divisible(6, mesh, microbatches=4)


def test_eight_fake_devices_build_each_mesh(on_eight_devices):
    code = textwrap.dedent("""
        import jax
        from celerity_jax.model import sharding
        assert jax.device_count() == 8
        for shape in [(8, 1, 1), (1, 8, 1), (2, 2, 2), (-1, 2, 1)]:
            mesh = sharding.make_mesh(shape)
            assert mesh.devices.size == 8
        print("ok")
    """)
    assert "ok" in on_eight_devices(code)


def test_an_axis_without_a_rule_is_an_error_naming_it():
    mesh = _fake_mesh((1, 2, 1))
    with pytest.raises(ValueError, match="'experts' has no entry in sharding.LOGICAL_RULES"):
        sharding.logical_spec(("experts", "embed"), (4, 64), mesh)
    with pytest.raises(ValueError, match="one axis per dim"):
        sharding.logical_spec(("embed",), (64, 64), mesh)


def test_unsplit_names_each_dim_its_axis_does_not_divide():
    cfg = presets.preset("tiny-d32")
    declared, shapes = _declared(cfg)
    assert sharding.unsplit(declared, shapes, _fake_mesh((1, 1, 1))) == []
    assert sharding.unsplit_note([]) == ""
    dims = sharding.unsplit(declared, shapes, _fake_mesh((1, 1, 2)))  # 257 byte ids; every other dim is even
    assert dims == ["vocab (257) over tensor (2)"]
    assert sharding.unsplit_note(dims) == "; kept whole, the mesh axis does not divide them: vocab (257) over tensor (2)"


def test_unsplit_activations_names_the_batch_sequence_and_heads_kept_whole():
    cfg = dataclasses.replace(presets.preset("tiny-d32"), n_heads=4, head_dim=8, n_kv_heads=2,
                              attention_impl="flash").for_platform("tpu")
    assert sharding.unsplit_activations(cfg, 8, 64, _fake_mesh((2, 2, 2))) == []
    assert sharding.unsplit_activations(cfg, 8, 64, _fake_mesh((1, 2, 4))) == []  # 2 kv heads repeated to 4
    assert sharding.unsplit_activations(cfg, 6, 63, _fake_mesh((1, 1, 8))) == [
        "sequence (63) over tensor (8)",
        "attention heads 4 and kv heads 2 over tensor (8), which must divide the heads and divide or be divided by "
        "the kv heads"]
    assert sharding.unsplit_activations(cfg, 6, 64, _fake_mesh((1, 4, 2))) == ["batch rows (6) over data×fsdp (4)"]
    blocked = dataclasses.replace(cfg, attention_impl="blocked")
    assert sharding.unsplit_activations(blocked, 8, 64, _fake_mesh((1, 2, 4))) == []


def test_flash_attention_split_over_tensor_reads_each_query_heads_own_key_value_head(on_eight_devices):
    """On a (1, 2, 4) mesh of 8 CPU devices: 4 heads over tensor 4 with 4, 2 (each repeated to one per chip) or 1
    key/value heads give blocked attention's values and gradients."""
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from celerity_jax.model import attention, sharding, transformer
        mesh = sharding.make_mesh((1, 2, 4))
        for kv_heads in (4, 2, 1):
            keys = jax.random.split(jax.random.key(kv_heads), 3)
            q = jax.random.normal(keys[0], (2, 32, 4, 16))
            k, v = (jax.random.normal(key, (2, 32, kv_heads, 16)) for key in keys[1:])
            flash = lambda q, k, v: transformer.platform_flash_attention(q, k, v, scale=0.25, alibi_slopes_H=None)
            blocked = lambda q, k, v: attention.causal_attention(q, k, v, scale=0.25)
            loss = lambda f: lambda *a: jnp.sum(f(*a) * jnp.cos(jnp.arange(16.0)))
            with jax.set_mesh(mesh):
                got = jax.jit(jax.value_and_grad(loss(flash), argnums=(0, 1, 2)))(q, k, v)
            want = jax.value_and_grad(loss(blocked), argnums=(0, 1, 2))(q, k, v)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        print("ok")
    """)
    assert "ok" in on_eight_devices(code)
