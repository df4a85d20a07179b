"""The run directory: refusal of a different run, and archiving."""

import json
import os

import pytest

from celerity_jax import rundir
from celerity_jax.errors import ConfigError
from celerity_jax.rundir.identity import Identity


def _identity(d_model: int) -> Identity:
    return Identity({"model": {"d_model": d_model, "n_heads": 3}, "plan": {"steps": 114}}, {})


def test_a_different_run_is_refused_naming_the_differences(tmp_path):
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps(_identity(48).record))
    assert rundir.check_workdir(str(tmp_path), _identity(48), force_new=False) is False
    with pytest.raises(ConfigError, match=r"different run \(model.d_model: 48 -> 64\).*--force-new"):
        rundir.check_workdir(str(tmp_path), _identity(64), force_new=False)
    assert rundir.check_workdir(str(tmp_path), _identity(64), force_new=True) is True


def test_a_config_field_added_since_counts_as_equal_at_its_default(tmp_path):
    defaults = {"monitor": {"n_bins": 1000, "loss_curve": "train"}}
    identity = Identity({"monitor": {"n_bins": 1000, "loss_curve": "train"}, "plan": {"steps": 114}}, defaults)
    older = {"monitor": {"n_bins": 1000}, "plan": {"steps": 114}}  # written before MonitorConfig.loss_curve
    (tmp_path / rundir.RUN_JSON).write_text(json.dumps(older))
    assert rundir.check_workdir(str(tmp_path), identity, force_new=False) is False
    changed = Identity({"monitor": {"n_bins": 1000, "loss_curve": "eval"}, "plan": {"steps": 114}}, defaults)
    with pytest.raises(ConfigError, match=r"monitor.loss_curve: None -> 'eval'"):
        rundir.check_workdir(str(tmp_path), changed, force_new=False)


def test_archiving_moves_the_run_and_keeps_the_lock_and_the_log(tmp_path):
    for name in (rundir.RUN_JSON, rundir.CURVE_CSV, rundir.LOCK_FILE, rundir.LOG_FILE):
        (tmp_path / name).write_text("x")
    notes = []
    rundir.archive_workdir(str(tmp_path), log=notes.append)
    archived = [n for n in os.listdir(tmp_path) if n.startswith(rundir.ARCHIVE_PREFIX)]
    assert len(archived) == 1 and "moved the previous run" in notes[0]
    assert sorted(os.listdir(tmp_path / archived[0])) == sorted([rundir.RUN_JSON, rundir.CURVE_CSV])
    assert sorted(os.listdir(tmp_path)) == sorted(archived + [rundir.LOCK_FILE, rundir.LOG_FILE])
