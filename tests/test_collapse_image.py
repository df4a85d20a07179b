"""The collapse figure: its PNG, and the trainer writing it to TensorBoard on the 5% schedule."""

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


class _ImageLog:
    """Stands in for TensorBoardWriter and CurveCSV: keeps the steps of the images."""

    def __init__(self):
        self.image_steps = []

    def image(self, step, tag, png):
        self.image_steps.append(step)

    def scalars(self, step, values):
        pass

    def append(self, rows):
        pass

    def flush(self):
        pass


def test_a_resumed_run_draws_the_figure_from_the_next_boundary_and_only_process_0_draws(monkeypatch):
    import types

    import jax.numpy as jnp

    from celerity_jax.collapse import monitor
    from celerity_jax.collapse.config import MonitorConfig
    from celerity_jax.configs import TrainConfig
    from celerity_jax.train import log_step
    from celerity_jax.train.progress import Progress

    drawn_at = []
    draw = image.collapse_figure
    monkeypatch.setattr(image, "collapse_figure", lambda *args: drawn_at.append(args[3]) or draw(*args))
    cfg = MonitorConfig(n_bins=50, smooth_bins=3)
    plan = types.SimpleNamespace(steps=100, batch_tokens=8, flops_per_token=1.0)
    run = types.SimpleNamespace(plan=plan, configs=types.SimpleNamespace(monitor=cfg, train=TrainConfig(loss_ema=0.9)))
    state = types.SimpleNamespace(monitor=monitor.monitor_init(cfg))
    chief = _ImageLog()
    for writers in (log_step.Writers(chief, chief), None):
        step_log = log_step.StepLog(run, writers, Progress(100, 42, quiet=True), 42,
                                    log_step.Measures(reference_G=jnp.linspace(2.0, 1.0, cfg.n_bins)))
        for step in range(48, 73, 6):
            step_log.record(step, state, {}, [jnp.float32(2.0)], last=step == 72)
    # boundaries at steps 45, 50, ..., 70: the first log step at or past 45 (48), 50 (54), 55 and 60 (60),
    # 65 (66), 70 (72, also the last step)
    assert chief.image_steps == [48, 54, 60, 66, 72]
    assert drawn_at == [0.48, 0.54, 0.60, 0.66, 0.72]
