"""The run's curve.csv (finite losses only; on resume, rows past the restored step set aside) and its TensorBoard
events."""

import csv
import math

from celerity_jax.rundir import writers


def _rows(path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_only_finite_losses_get_a_row(tmp_path):
    path = str(tmp_path / "curve.csv")
    writers.CurveCSV(path, resume_step=0).append([(1, 64, 0.1, 5.0), (2, 128, 0.2, math.nan), (3, 192, 0.3, 4.5)])
    assert _rows(path) == [list(writers.CURVE_COLUMNS), ["1", "64", "0.1", "5.0"], ["3", "192", "0.3", "4.5"]]


def test_a_resume_sets_the_rows_past_the_restored_step_aside(tmp_path):
    path = str(tmp_path / "curve.csv")
    writers.CurveCSV(path, resume_step=0).append([(s, 64 * s, s / 10, 5.0 - s / 10) for s in range(1, 6)])
    curve = writers.CurveCSV(path, resume_step=3)
    assert [r[0] for r in _rows(path)] == ["step", "1", "2", "3"]
    assert [r[0] for r in _rows(path + ".discarded")] == ["4", "5"]
    curve.append([(4, 256, 0.4, 4.0)])
    assert [r[0] for r in _rows(path)] == ["step", "1", "2", "3", "4"]
    writers.CurveCSV(path, resume_step=4)
    assert [r[0] for r in _rows(path + ".discarded")] == ["4", "5"]


def test_scalars_and_text_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = writers.TensorBoardWriter(str(tmp_path))
    tb.scalars(7, {"train/loss": 3.5})
    tb.text(7, "config/operative_gin", "ModelConfig.d_model = 48")
    tb.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    [scalar] = events.Scalars("train/loss")
    assert (scalar.step, scalar.value) == (7, 3.5)
    assert events.Tags()["tensors"] == ["config/operative_gin"]
