"""The run directory: identity, refusal of a different run, archiving, and the log file."""

import json
import logging
import os

import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.train import logfile, rundir


def _identity(d_model: int) -> dict:
    return {"model": {"d_model": d_model, "n_heads": 3}, "plan": {"steps": 114}}


def test_a_different_run_is_refused_naming_the_differences(tmp_path):
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps(_identity(48)))
    assert rundir.check_workdir(str(tmp_path), _identity(48), force_new=False) is False
    with pytest.raises(ConfigError, match=r"different run \(model.d_model: 48 -> 64\).*--force-new"):
        rundir.check_workdir(str(tmp_path), _identity(64), force_new=False)
    assert rundir.check_workdir(str(tmp_path), _identity(64), force_new=True) is True


def test_a_config_field_added_since_counts_as_equal_at_its_default(tmp_path):
    identity = {"monitor": {"n_bins": 1000, "loss_curve": "train"}, "plan": {"steps": 114}}
    older = {"monitor": {"n_bins": 1000}, "plan": {"steps": 114}}  # written before MonitorConfig.loss_curve
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps(older))
    assert rundir.check_workdir(str(tmp_path), identity, force_new=False) is False
    changed = {"monitor": {"n_bins": 1000, "loss_curve": "eval"}, "plan": {"steps": 114}}
    with pytest.raises(ConfigError, match=r"monitor.loss_curve: None -> 'eval'"):
        rundir.check_workdir(str(tmp_path), changed, force_new=False)
    assert not rundir.same_run({"monitor": {"n_bins": 1000}, "plan": {}}, identity)  # a plan key is never filled


def test_archiving_moves_the_run_and_keeps_the_lock_and_the_log(tmp_path):
    for name in (rundir.RUN_JSON, rundir.CURVE_CSV, rundir.LOCK_FILE, rundir.LOG_FILE):
        (tmp_path / name).write_text("x")
    notes = []
    rundir.archive_workdir(str(tmp_path), log=notes.append)
    archived = [n for n in os.listdir(tmp_path) if n.startswith(rundir.ARCHIVE_PREFIX)]
    assert len(archived) == 1 and "moved the previous run" in notes[0]
    assert sorted(os.listdir(tmp_path / archived[0])) == sorted([rundir.RUN_JSON, rundir.CURVE_CSV])
    assert sorted(os.listdir(tmp_path)) == sorted(archived + [rundir.LOCK_FILE, rundir.LOG_FILE])


def test_diff_names_every_changed_leaf():
    assert rundir.diff({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3, "d": 4}}) == ["a.c: 2 -> 3", "a.d: None -> 4"]


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
