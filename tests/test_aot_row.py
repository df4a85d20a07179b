"""The rows of `compile --search`: how each is decided, and their JSON as the stored results hold it."""

import dataclasses
import json
import os

from celerity_jax.aot.compile import StepSetting
from celerity_jax.aot.row import ROW_KEYS, Row, Verdict, usable

REPORT = {"topology": "v5e-4", "mesh_shape": [1, 4, 1], "microbatches": 2, "remat": "none", "scan_layers": True,
          "bytes_per_chip": 3e9, "fits": True, "headroom": 0.8, "error": None, "est_step_seconds": 0.5,
          "est_mfu": 0.4, "gin_params": []}


def test_a_rows_json_keys_follow_how_it_was_decided():
    setting = StepSetting((1, 4, 1), 2, "none", True)
    by_model = Row(setting, model_bytes=2e9, by_model=Verdict.FITS).updated(dict(REPORT, fits=None))
    assert list(by_model.to_json()) == [*ROW_KEYS, "by_model", "topology", "error", "gin_params"]
    assert by_model.to_json()["fits"] is False and by_model.to_json()["est_step_seconds"] == 0.5
    checked = dataclasses.replace(by_model, by_model=None).updated(REPORT)  # XLA compiled the step it led with
    assert list(checked.to_json()) == [*ROW_KEYS, "topology", "error", "gin_params"] and checked.to_json()["fits"]
    compiled = Row.of_step_compile(REPORT)
    assert list(compiled.to_json()) == [*REPORT, "model_bytes"] and compiled.to_json()["fits"] is True
    failed = compiled.updated(Row(setting, skipped="the compile failed: lost", error="lost"))
    assert failed.to_json()["error"] == "lost" and list(failed.to_json())[-1] == "skipped"
    assert list(Row(setting, skipped="no").to_json()) == [*ROW_KEYS, "skipped"]


def test_the_stored_rows_read_back_and_write_the_same_json(repo_root):
    with open(os.path.join(repo_root, "experiments", "celerity", "tpu_plans.json")) as f:
        searches = json.load(f)
    rows = [row for s in searches for row in s["tried"] + [s["best"]] if row]
    assert {bool(r.get("by_model")) for r in rows} == {True, False} and any("skipped" in r for r in rows)
    for row in rows:
        assert json.dumps(Row.from_json(row).to_json()) == json.dumps(row)


def test_a_row_is_usable_when_xla_says_it_fits_with_headroom():
    setting = StepSetting((1, 4, 1), 2, "none", True)
    assert usable(Row(setting, fits=True, headroom=0.1)) and not usable(Row(setting, fits=True, headroom=0.05))
    assert not usable(Row(setting, by_model=Verdict.FITS))  # the model's verdict is not XLA's
