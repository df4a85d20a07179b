"""`celerity.log`: library output during a run."""

import logging

from celerity_jax.train import logfile


def test_library_output_goes_to_the_log_file(tmp_path, capsys):
    with logfile.library_output_to_log(str(tmp_path)) as path:
        logging.getLogger("absl").error("orbax noise")

        class Unraisable:
            def __del__(self):
                raise RuntimeError("Event loop is closed")

        Unraisable()
    assert capsys.readouterr().err == ""
    with open(path) as f:
        text = f.read()
    assert "orbax noise" in text and "Event loop is closed" in text
