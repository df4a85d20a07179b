"""The progress line of `celerity prepare-data`: share done, files, tokens/s and ETA."""

import sys
import time

LOG_SECONDS = 30.0  # without a terminal, one line this often (so short runs print none)
REDRAW_SECONDS = 0.5


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts bytes, files and tokens done; the rate and ETA count only this run's work (not resumed work)."""

    def __init__(self, total_bytes: int, total_files: int, done_bytes: int = 0, done_files: int = 0,
                 stream=None):
        self.total_bytes, self.total_files = total_bytes, total_files
        self.done_bytes, self.done_files, self.tokens = done_bytes, done_files, 0
        self._resumed_bytes = done_bytes
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._start = self._shown = time.monotonic()

    def update(self, n_bytes: int, n_files: int, n_tokens: int) -> None:
        self.done_bytes += n_bytes
        self.done_files += n_files
        self.tokens += n_tokens
        now = time.monotonic()
        if now - self._shown >= (REDRAW_SECONDS if self._tty else LOG_SECONDS):
            self._shown = now
            self._stream.write(("\r" if self._tty else "") + self.line() + ("" if self._tty else "\n"))
            self._stream.flush()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        share = self.done_bytes / self.total_bytes if self.total_bytes else 1.0
        byte_rate = (self.done_bytes - self._resumed_bytes) / elapsed
        eta = _clock((self.total_bytes - self.done_bytes) / byte_rate) if byte_rate else "?"
        return (f"prepare-data: {share:6.1%} of {self.total_bytes / 1e9:.2f} GB, files {self.done_files}/"
                f"{self.total_files}, {self.tokens / elapsed / 1e6:.2f}M tokens/s, ETA {eta}")

    def close(self) -> str:
        """Clears the redrawn line; returns the closing summary (tokens, time, rate)."""
        if self._tty:
            self._stream.write("\r\033[K")
            self._stream.flush()
        elapsed = time.monotonic() - self._start
        return (f"{self.tokens:,} tokens in {_clock(elapsed)} ({self.tokens / max(elapsed, 1e-9) / 1e6:.2f}M "
                f"tokens/s), {self.done_files}/{self.total_files} files")
