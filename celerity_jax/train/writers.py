"""Where a run's numbers go: TensorBoard events, `curve.csv`, and a console progress line.

TensorBoard events are written with the `tensorboard` package alone (no TensorFlow).
"""

import csv
import io
import math
import os
import struct
import sys
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


class Progress:
    """A one-line progress bar with ETA on a terminal; plain log lines otherwise."""

    def __init__(self, total_steps: int, start_step: int, stream=sys.stdout, quiet: bool = False):
        self.quiet = quiet
        self.total = total_steps
        self.start_step = start_step
        self.start_time = time.time()
        self.stream = stream
        self.tty = stream.isatty()

    def update(self, step: int, values: dict[str, float]) -> None:
        if self.quiet:
            return
        done = step - self.start_step
        elapsed = time.time() - self.start_time
        eta = elapsed / done * (self.total - step) if done > 0 else math.nan
        fields = "  ".join(f"{k}={v:.4g}" for k, v in values.items())
        if self.tty:
            width = 30
            filled = int(width * step / max(self.total, 1))
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r[{bar}] {step}/{self.total}  {fields}  eta {_hms(eta)}   ")
        else:
            self.stream.write(f"step {step}/{self.total}  {fields}  eta {_hms(eta)}\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\n")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
