"""Where a run's numbers go in its directory: TensorBoard events and `curve.csv` (and `eval.csv`).

TensorBoard events are written with the `tensorboard` package alone (no TensorFlow).
"""

import csv
import io
import math
import os
import struct
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from celerity_jax.fileio import write_text_atomic

CURVE_COLUMNS = ("step", "tokens", "frac", "loss")


class TensorBoardWriter:
    """Scalars, text and images into one TensorBoard run directory."""

    def __init__(self, logdir: str):
        self._writer = EventFileWriter(logdir, flush_secs=10)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def text(self, step: int, tag: str, text: str) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=text_pb(tag, text)))

    def image(self, step: int, tag: str, png: bytes) -> None:
        """A PNG image, as a (legacy) image summary: TensorBoard's Images tab reads it without TensorFlow."""
        width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk, first in every PNG
        image = summary_pb2.Summary.Image(width=width, height=height, colorspace=4, encoded_image_string=png)  # RGBA
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, image=image)])
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class CurveCSV:
    """Appends (step, tokens, frac, loss) rows of finite losses; on resume, drops rows past the
    restored step.

    Rows past the restored checkpoint belong to steps that will be trained again, so keeping them
    would duplicate steps. The dropped rows are kept in `curve.csv.discarded` for inspection. Steps
    whose loss was not finite (skipped, see TrainConfig.max_bad_steps) have no row.
    """

    def __init__(self, path: str, resume_step: int):
        self.path = path
        if os.path.exists(path):
            self._truncate_after(resume_step)
        else:
            with open(path, "w", newline="") as f:
                csv.writer(f).writerow(CURVE_COLUMNS)

    def _truncate_after(self, resume_step: int) -> None:
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        header, body = rows[0], rows[1:]
        kept = [r for r in body if r and int(r[0]) <= resume_step]
        dropped = [r for r in body if r and int(r[0]) > resume_step]
        if not dropped:
            return
        with open(self.path + ".discarded", "a", newline="") as f:
            csv.writer(f).writerows(dropped)
        text = io.StringIO()
        csv.writer(text).writerows([header] + kept)
        write_text_atomic(self.path, text.getvalue())

    def append(self, rows: list[tuple[int, int, float, float]]) -> None:
        with open(self.path, "a", newline="") as f:
            w = csv.writer(f)
            for step, tokens, frac, loss in rows:
                if math.isfinite(loss):
                    w.writerow((step, tokens, repr(float(frac)), repr(float(loss))))
