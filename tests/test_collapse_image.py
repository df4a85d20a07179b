"""The collapse figure: its PNG, and a training run writing it to TensorBoard on the 5% schedule."""

import io

import numpy as np
from PIL import Image

from celerity_jax.collapse import curves, image

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _decoded_size(png: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(png)) as decoded:
        decoded.load()
        return decoded.size


def test_figure_is_a_png_with_and_without_a_prediction():
    frac_G = curves.bin_centers(200)
    reference_G = 1.0 + 2.0 * np.exp(-5.0 * frac_G)
    normalized_G = np.where(frac_G < 0.6, 1.01 * reference_G, np.nan)
    for png in (image.collapse_figure(frac_G, normalized_G, reference_G, 0.6, 2.5, 0.01),
                image.collapse_figure(frac_G, np.full_like(frac_G, np.nan), reference_G, 0.1, np.nan, np.nan)):
        assert png.startswith(PNG_MAGIC)
        width, height = _decoded_size(png)
        assert width > 100 and height > 100


def test_training_with_a_reference_writes_the_figure_at_each_5_percent_and_the_last_step(tmp_path, tiny_configs,
                                                                                         tiny_run):
    from tensorboard.backend.event_processing import event_accumulator

    from celerity_jax import recipe
    from celerity_jax.collapse import files, reference
    from celerity_jax.collapse.controls import Controls
    from celerity_jax.train import log_step, loop

    configs = tiny_configs()
    plan = recipe.make_plan(configs.model, configs.recipe)
    ref = reference.reference_from_surrogate(files.default_surrogate(), Controls.from_plan(plan),
                                             configs.monitor.n_bins)
    files.save_reference(ref, str(tmp_path / "ref.json"))
    workdir = str(tmp_path / "run")
    last_step = plan.steps // 2 + 5  # past t̂ = 0.3, where predictions start; not on a 5% boundary
    loop.train(tiny_run(f"TrainConfig.stop_at_step = {last_step}",
                        f"TrainConfig.collapse_reference = ('{tmp_path / 'ref.json'}',)"),
               workdir, log=lambda _: None)

    events = event_accumulator.EventAccumulator(workdir, size_guidance={event_accumulator.IMAGES: 0,
                                                                        event_accumulator.SCALARS: 0})
    events.Reload()
    assert events.Tags()["images"] == [log_step.FIGURE_TAG]
    log_steps = [e.step for e in events.Scalars("progress/frac")]
    assert log_steps[-1] == last_step
    first_past = {min(s for s in log_steps if 20 * s >= k * plan.steps) for k in range(1, 21)
                  if 20 * last_step >= k * plan.steps}
    assert last_step not in first_past  # so its figure is the last step's own
    figures = events.Images(log_step.FIGURE_TAG)
    assert [e.step for e in figures] == sorted(first_past | {last_step})
    for figure in figures:
        assert figure.encoded_image_string.startswith(PNG_MAGIC)
        assert _decoded_size(figure.encoded_image_string) == (figure.width, figure.height)
