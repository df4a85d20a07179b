"""The compiled train step: the same 20 steps on one device and on 8 fake CPU devices under each mesh shape, and the
step's setting, which `celerity train` and `celerity compile` state."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from celerity_jax import recipe
from celerity_jax.aot.compile import slice_devices
from celerity_jax.model.sharding import make_mesh
from celerity_jax.train import loop, step as step_lib

STEPS = ("TrainConfig.stop_at_step = 20", "TrainConfig.eval_every = 0", "TrainConfig.checkpoint_every = 20")


@pytest.fixture(scope="module")
def one_device_losses(tmp_path_factory, curve_losses, tiny_run):
    workdir = tmp_path_factory.mktemp("one")
    loop.train(tiny_run(*STEPS), str(workdir), log=lambda _: None)
    return curve_losses(workdir)


@pytest.mark.parametrize("mesh", [(8, 1, 1), (1, 8, 1), (2, 2, 2)])
def test_sharded_losses_match_one_device(mesh, one_device_losses, tmp_path, curve_losses, tiny_gin, repo_root):
    code = textwrap.dedent(f"""
        import jax
        from celerity_jax import gin_config
        from celerity_jax.configs import RunDefinition
        from celerity_jax.train import loop
        assert jax.device_count() == 8
        configs = gin_config.parse_gin({tiny_gin!r}, {list(STEPS)!r} + ["TrainConfig.mesh_shape = {mesh}"])
        loop.train(RunDefinition.of(configs), {str(tmp_path)!r}, log=lambda _: None)
    """)
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = curve_losses(tmp_path)
    np.testing.assert_allclose([got[s] for s in range(1, 21)], [one_device_losses[s] for s in range(1, 21)],
                               rtol=1e-5)


def test_the_setting_line_states_the_dims_the_mesh_does_not_split(tiny_configs, tpu_slice):
    configs = tiny_configs()
    plan = recipe.make_plan(configs.model, configs.recipe)
    mesh = make_mesh((1, 1, 4), devices=slice_devices(tpu_slice)[1])  # nothing is compiled
    build = step_lib.build_step(configs.model, plan, configs.monitor, mesh, microbatches=2, z_loss=0.0, seed=0)
    setting = build.setting(plan)
    assert setting["unsplit"] == ["vocab (257) over tensor (4)"]
    assert step_lib.setting_line(setting) == (
        "mesh (data, fsdp, tensor) (1, 1, 4), 2 microbatches, remat none, scan_layers False, float32 (residual "
        "float32), attention blocked, whole logits; kept whole, the mesh axis does not divide them: vocab (257) over "
        "tensor (4)")
