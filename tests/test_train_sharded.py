"""The same 20 steps on one device and on 8 fake CPU devices under each mesh shape."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from celerity_jax.train import loop

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
