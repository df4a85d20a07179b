"""The progress line of `celerity prepare-data`."""

import io

from celerity_jax.data.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_share_files_rate_and_eta(monkeypatch):
    monkeypatch.setattr("celerity_jax.data.progress.REDRAW_SECONDS", 0.0)
    stream = _Terminal()
    progress = Progress(total_bytes=4_000_000_000, total_files=10, done_bytes=1_000_000_000, done_files=2,
                        stream=stream)
    progress.update(1_000_000_000, 3, 250_000_000)
    line = stream.getvalue().split("\r")[-1]
    assert line.startswith("prepare-data:  50.0% of 4.00 GB, files 5/10, ") and "M tokens/s, ETA 0:" in line
    assert progress.close().startswith("250,000,000 tokens in 0:00:00 (") and stream.getvalue().endswith("\r\033[K")
