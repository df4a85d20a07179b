"""The compiled train step's setting: what `celerity train` and `celerity compile` state about it."""

from celerity_jax import recipe
from celerity_jax.aot.compile import slice_devices
from celerity_jax.model.sharding import make_mesh
from celerity_jax.train import step as step_lib


def test_the_setting_line_states_the_dims_the_mesh_does_not_split(tiny_configs, tpu_slice):
    configs = tiny_configs()
    plan = recipe.make_plan(configs.model, configs.recipe)
    mesh = make_mesh((1, 1, 4), devices=slice_devices(tpu_slice)[1])  # nothing is compiled
    build = step_lib.build_step(configs.model, plan, configs.monitor, mesh, microbatches=2, z_loss=0.0, seed=0)
    setting = build.setting(plan)
    assert setting["unsplit"] == ["embed dim 0 (257) over tensor (4)", "unembed dim 1 (257) over tensor (4)"]
    assert step_lib.setting_line(setting) == (
        "mesh (data, fsdp, tensor) (1, 1, 4), 2 microbatches, remat none, scan_layers False, float32, attention "
        "blocked, whole logits; kept whole, the mesh axis does not divide them: embed dim 0 (257) over tensor (4), "
        "unembed dim 1 (257) over tensor (4)")
