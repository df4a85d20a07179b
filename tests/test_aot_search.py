"""`celerity compile --search`: the fastest setting that fits, what it tried, its walk, budget and Ctrl-C."""

import ast
import dataclasses
import os
import pathlib
import time

import pytest

from celerity_jax.aot import search
from celerity_jax.aot.cache import Cache
from celerity_jax.aot.compile import StepSetting
from celerity_jax.aot.row import Row, Verdict



@pytest.mark.slow  # 20 s
def test_search_returns_a_setting_that_fits_and_what_it_tried(tmp_path, tiny_configs, tpu_slice):
    found = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), log=lambda _: None)
    assert found.stopped is None and search.usable(found.best) and found.best in found.tried
    assert found.best.est_step_seconds == min(r.est_step_seconds for r in found.tried if r.est_step_seconds)
    assert found.best.bytes_per_chip and found.best.by_model is None  # the winner's memory is XLA's
    assert {r.setting.mesh_shape for r in found.tried} >= {(1, 4, 1), (4, 1, 1)}
    cached = os.listdir(tmp_path)
    again = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), log=lambda _: None)
    assert again.best == found.best and os.listdir(tmp_path) == cached  # every compile came from the cache


def test_candidate_meshes():
    assert search.candidate_meshes(8, 10) == [(1, 8, 1), (8, 1, 1), (1, 4, 2)]
    assert search.candidate_meshes(16, 16) == [(1, 16, 1), (16, 1, 1), (1, 8, 2), (1, 4, 4)]


def test_search_skips_meshes_the_batch_does_not_split_over(tiny_configs, tpu_slice):
    found = search.search(tiny_configs("RecipeConfig.batch_seqs = 6"), tpu_slice, log=lambda _: None)
    assert found.best is None and all("does not split over 4 data shards" in r.skipped for r in found.tried)


@pytest.mark.slow  # 25 s
def test_a_leader_xla_rejects_loses_to_the_sizes_below_it(tiny_configs, tpu_slice, tmp_path, monkeypatch):
    judged_by_xla = search.usable

    def usable(row):  # XLA's compile of the largest microbatch without remat comes out too large
        rejected = (row.setting.microbatches, row.setting.remat) == (1, "none") and row.bytes_per_chip
        return judged_by_xla(row) and not rejected

    monkeypatch.setattr(search, "usable", usable)
    found = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), meshes=[(1, 4, 1)],
                          log=lambda _: None)
    rows = {(r.setting.microbatches, r.setting.remat): r for r in found.tried}
    assert rows[(1, "none")].bytes_per_chip and rows[(1, "none")].by_model is None
    assert (found.best.setting.microbatches, found.best.setting.remat) in {(2, "none"), (1, "dots")}
    assert rows[(2, "none")].est_step_seconds and rows[(1, "dots")].est_step_seconds
    assert len(found.tried) == len(rows)  # a setting decided again replaces its row


def test_a_budget_stops_the_search_with_the_best_found_so_far(tiny_configs, tpu_slice, tmp_path):
    def slow_log(line):
        if "compiled" in line:
            time.sleep(1.5)  # the budget passes while the first row is reported

    found = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), budget_seconds=1.0,
                          log=slow_log)
    assert found.stopped == "budget" and found.best is not None and found.best.by_model == Verdict.FITS
    summary = search.search_summary(found)
    assert summary.startswith("STOPPED EARLY at the budget") and "best so far: mesh" in summary


def test_ctrl_c_stops_the_search_with_the_best_found_so_far(tiny_configs, tpu_slice, tmp_path):
    def interrupt(line):
        if " est " in line:
            raise KeyboardInterrupt

    found = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), log=interrupt)
    assert found.stopped == "interrupted" and found.best.est_step_seconds > 0
    assert os.listdir(tmp_path)  # what was compiled stays cached
    assert search.search_summary(found).startswith("STOPPED EARLY (Ctrl-C)")


def test_rows_show_xla_beside_the_model_or_the_model_alone():
    row = Row(StepSetting((1, 4, 1), 2, "none", True), fits=True, headroom=0.5, bytes_per_chip=2.0e9,
              model_bytes=2.5e9, est_step_seconds=0.25, est_mfu=0.5)
    assert search.format_row(row) == ("mesh (1, 4, 1) micro   2 remat none scan y  fits     2.0 GB (model 2.5)"
                                      "  est 0.250 s/step, MFU 50%")
    by_model = dataclasses.replace(row, fits=None, bytes_per_chip=None, by_model=Verdict.TOO_BIG,
                                   est_step_seconds=None)
    assert search.format_row(by_model) == "mesh (1, 4, 1) micro   2 remat none scan y  OOM      2.5 GB by the footprint model"


def test_no_function_in_aot_is_longer_than_60_lines(repo_root):
    lengths = {f"{path.name}:{node.name}": node.end_lineno - node.lineno + 1
               for path in pathlib.Path(repo_root, "celerity_jax", "aot").glob("*.py")
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert len(lengths) > 50 and max(lengths.values()) <= 60, max(lengths.items(), key=lambda kv: kv[1])
