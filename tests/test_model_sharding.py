import os
import subprocess
import sys
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


def test_param_specs_follow_the_rules():
    mesh = _fake_mesh((2, 2, 2))
    assert sharding.param_spec(("embed",), (256, 64), mesh) == P("tensor", "fsdp")
    assert sharding.param_spec(("block_0", "attn", "q", "kernel"), (64, 64), mesh) == P("fsdp", "tensor")
    assert sharding.param_spec(("block_0", "mlp", "down", "kernel"), (512, 64), mesh) == P("tensor", "fsdp")
    assert sharding.param_spec(("blocks", "mlp", "up", "kernel"), (4, 64, 512), mesh) == P(None, "fsdp", "tensor")
    assert sharding.param_spec(("block_0", "attn_norm", "scale"), (64,), mesh) == P()
    assert sharding.param_spec(("block_0", "attn", "q", "bias"), (64,), mesh) == P()


def test_indivisible_dims_stay_whole():
    mesh = _fake_mesh((1, 8, 2))
    assert sharding.param_spec(("unembed",), (36, 259), mesh) == P(None, None)


def test_every_parameter_gets_a_spec():
    cfg = presets.preset("tiny-d32")
    shapes = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    shardings = sharding.param_shardings(shapes, mesh)
    assert jax.tree.structure(shardings) == jax.tree.structure(shapes)


def test_bad_mesh_shapes_are_refused():
    with pytest.raises(ConfigError, match="devices"):
        sharding.make_mesh((3, 1, 1), jax.devices()[:1] * 1)
    mesh = sharding.make_mesh((-1, 1, 1), jax.devices()[:1])
    with pytest.raises(ConfigError, match="microbatches"):
        sharding.check_batch_divisible(6, mesh, microbatches=4)


def test_eight_fake_devices_build_each_mesh():
    code = textwrap.dedent("""
        import jax
        from celerity_jax.model import sharding
        assert jax.device_count() == 8
        for shape in [(8, 1, 1), (1, 8, 1), (2, 2, 2), (-1, 2, 1)]:
            mesh = sharding.make_mesh(shape)
            assert mesh.devices.size == 8
        print("ok")
    """)
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_a_parameter_without_a_rule_is_an_error_naming_it():
    mesh = _fake_mesh((1, 2, 1))
    with pytest.raises(ValueError, match=r"no sharding rule for the parameter block_0/mlp/extra/kernel .*'extra'"):
        sharding.param_spec(("block_0", "mlp", "extra", "kernel"), (64, 64), mesh)
    with pytest.raises(ValueError, match="pos_embed"):
        sharding.param_spec(("pos_embed",), (64,), mesh)  # fewer dims than its rule


def test_unsplit_names_each_dim_its_axis_does_not_divide():
    cfg = presets.preset("tiny-d32")
    shapes = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    assert sharding.unsplit(shapes, _fake_mesh((1, 1, 1))) == []
    assert sharding.unsplit_note([]) == ""
    dims = sharding.unsplit(shapes, _fake_mesh((1, 1, 2)))  # 257 byte ids; every other dim is even
    assert dims == ["embed dim 0 (257) over tensor (2)", "unembed dim 1 (257) over tensor (2)"]
    assert sharding.unsplit_note(dims) == ("; kept whole, the mesh axis does not divide them: "
                                           "embed dim 0 (257) over tensor (2), unembed dim 1 (257) over tensor (2)")
