"""The log step of the training loop: when it draws the collapse figure."""

import types

import jax.numpy as jnp

from celerity_jax.collapse import image, monitor
from celerity_jax.collapse.config import MonitorConfig
from celerity_jax.configs import TrainConfig
from celerity_jax.train import log_step
from celerity_jax.train.progress import Progress


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
