"""The console progress line of a training run: a redrawn bar on a terminal, plain lines in a log."""

import io

from celerity_jax.train.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_one_redrawn_bar_and_a_log_gets_lines():
    terminal = _Terminal()
    progress = Progress(total_steps=100, start_step=0, stream=terminal)
    progress.update(50, {"loss": 3.14159})
    progress.message("checkpoint saved")
    progress.close()
    assert terminal.getvalue().startswith("\r[" + "#" * 15 + "-" * 15 + "] 50/100  loss=3.142  eta 0:00:")
    assert terminal.getvalue().endswith("\ncheckpoint saved\n\n")
    log = io.StringIO()
    progress = Progress(total_steps=100, start_step=50, stream=log)
    progress.update(50, {"loss": 3.0})
    progress.update(60, {"loss": 2.5})
    progress.close()
    first, second = log.getvalue().splitlines()
    assert first == "step 50/100  loss=3  eta ?" and second.startswith("step 60/100  loss=2.5  eta 0:00:")


def test_quiet_writes_nothing():
    terminal = _Terminal()
    progress = Progress(total_steps=100, start_step=0, stream=terminal, quiet=True)
    progress.update(50, {"loss": 3.0})
    progress.message("checkpoint saved")
    progress.close()
    assert terminal.getvalue() == ""
