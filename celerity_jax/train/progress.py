"""The console progress line of a training run."""

import math
import sys
import time


class Progress:
    """A one-line progress bar with ETA on a terminal; plain log lines otherwise."""

    def __init__(self, total_steps: int, start_step: int, stream=None, quiet: bool = False):
        self.quiet = quiet
        self.total = total_steps
        self.start_step = start_step
        self.start_time = time.time()
        self.stream = sys.stdout if stream is None else stream  # stdout as it is now, not at import
        self.tty = self.stream.isatty()

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
