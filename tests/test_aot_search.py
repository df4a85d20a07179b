"""`celerity compile --search`: the fastest setting that fits, what it tried, its walk, budget and Ctrl-C."""

import os
import time

import pytest

from celerity_jax import recipe
from celerity_jax.aot import search
from celerity_jax.aot.cache import Cache


@pytest.mark.slow  # 20 s
def test_search_returns_a_setting_that_fits_and_what_it_tried(tmp_path, tiny_configs, tpu_slice):
    found = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), log=lambda _: None)
    assert found.stopped is None and search.usable(found.best) and found.best in found.tried
    assert found.best["est_step_seconds"] == min(r["est_step_seconds"] for r in found.tried
                                                 if r.get("est_step_seconds"))
    assert found.best["bytes_per_chip"] and "by_model" not in found.best  # the winner's memory is XLA's
    assert {tuple(r["mesh_shape"]) for r in found.tried} >= {(1, 4, 1), (4, 1, 1)}
    cached = os.listdir(tmp_path)
    again = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), log=lambda _: None)
    assert again.best == found.best and os.listdir(tmp_path) == cached  # every compile came from the cache


def test_candidate_meshes_and_microbatch_sizes():
    assert search.candidate_meshes(8, 10) == [(1, 8, 1), (8, 1, 1), (1, 4, 2)]
    assert search.candidate_meshes(16, 16) == [(1, 16, 1), (16, 1, 1), (1, 8, 2), (1, 4, 4)]
    assert search.microbatch_seqs(44) == [1, 2, 4, 44]
    assert search.microbatch_seqs(1) == [1]


def test_search_skips_meshes_the_batch_does_not_split_over(tiny_configs, tpu_slice):
    found = search.search(tiny_configs("RecipeConfig.batch_seqs = 6"), tpu_slice, log=lambda _: None)
    assert found.best is None and all("does not split over 4 data shards" in r["skipped"] for r in found.tried)


def _walk(configs, topology, mesh=(1, 4, 1)):
    return search._MeshWalk(configs, topology, mesh, recipe.make_plan(configs.model, configs.recipe))


def _compiled(walk, index, fits: bool):
    setting = walk.setting(index)
    gb = 1.0 if fits else 100.0
    return {"mesh_shape": list(setting.mesh_shape), "microbatches": setting.microbatches, "remat": setting.remat,
            "scan_layers": True, "fits": fits, "headroom": 0.9 if fits else None, "bytes_per_chip": gb * 1e9}


def test_the_footprint_model_decides_where_it_is_sure(tiny_configs, tpu_slice):
    walk = _walk(tiny_configs("RecipeConfig.batch_seqs = 64"), tpu_slice)  # 16 per shard: sizes 1, 2, 4, 8, 16
    assert walk.sizes == [1, 2, 4, 8, 16]
    # the tiny model fits whole by far: the largest microbatch, without remat and without a compile; dots and
    # full could only win with a larger microbatch, and there is none
    assert walk.compile_index is None and not walk.remats
    assert [(r["microbatches"], r["remat"], r["by_model"]) for r in walk.settled] == [(1, "none", "fits")]


def test_a_size_the_model_is_unsure_of_is_compiled_and_the_walk_steps_down_and_on(tiny_configs, tpu_slice,
                                                                                  monkeypatch):
    monkeypatch.setattr(search, "SURE_FITS", 1e12)  # the model is never sure
    monkeypatch.setattr(search, "SLACK", 1e12)
    walk = _walk(tiny_configs("RecipeConfig.batch_seqs = 64"), tpu_slice)
    assert walk.compile_index == 4 and walk.remats[0] == "none"  # the largest microbatch first
    model = walk.model_bytes(4)
    walk.record(4, _compiled(walk, 4, fits=False))
    assert walk.compile_index == 3  # one size down
    assert walk.ratio == pytest.approx(100e9 / model)  # the model scaled by XLA's bytes, for this remat
    walk.record(3, _compiled(walk, 3, fits=True))
    assert [(r["microbatches"], r["remat"]) for r in walk.settled] == [(2, "none")] and walk.floor == 3
    # dots can only win above 8 sequences per shard
    assert walk.remats[0] == "dots" and walk.compile_index == 4
    walk.record(4, _compiled(walk, 4, fits=False))
    assert walk.remats[0] == "full" and walk.compile_index == 4  # nothing between: dots is done, full tries
    walk.record(4, _compiled(walk, 4, fits=True))
    assert [(r["microbatches"], r["remat"]) for r in walk.settled] == [(2, "none"), (1, "full")]
    assert walk.compile_index is None


def test_a_setting_its_check_rejects_is_walked_again_below(tiny_configs, tpu_slice, monkeypatch):
    walk = _walk(tiny_configs("RecipeConfig.batch_seqs = 64"), tpu_slice)
    assert [(r["microbatches"], r["remat"], r["by_model"]) for r in walk.settled] == [(1, "none", "fits")]
    monkeypatch.setattr(search, "SURE_FITS", 1e12)  # from here on, the model is never sure
    monkeypatch.setattr(search, "SLACK", 1e12)
    again = walk.below(dict(walk.settled[0], fits=False, headroom=None, bytes_per_chip=100e9))
    assert again.ratio == pytest.approx(100e9 / walk.settled[0]["model_bytes"])
    assert again.remats[0] == "none" and again.compile_index == 3  # under the size XLA rejected
    again.record(3, _compiled(again, 3, fits=True))
    # dots was never walked at the largest size (no remat fit there, by the model): now it is
    assert again.remats[0] == "dots" and again.compile_index == 4
    again.record(4, _compiled(again, 4, fits=True))
    assert [(r["microbatches"], r["remat"]) for r in again.settled] == [(2, "none"), (1, "dots")]
    assert again.compile_index is None and not again.remats


@pytest.mark.slow  # 25 s
def test_a_leader_xla_rejects_loses_to_the_sizes_below_it(tiny_configs, tpu_slice, tmp_path, monkeypatch):
    judged_by_xla = search.usable

    def usable(report):  # XLA's compile of the largest microbatch without remat comes out too large
        rejected = (report["microbatches"], report["remat"]) == (1, "none") and report.get("bytes_per_chip")
        return judged_by_xla(report) and not rejected

    monkeypatch.setattr(search, "usable", usable)
    found = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), meshes=[(1, 4, 1)],
                          log=lambda _: None)
    rows = {(r["microbatches"], r["remat"]): r for r in found.tried}
    assert rows[(1, "none")]["bytes_per_chip"] and "by_model" not in rows[(1, "none")]
    assert (found.best["microbatches"], found.best["remat"]) in {(2, "none"), (1, "dots")}
    assert rows[(2, "none")].get("est_step_seconds") and rows[(1, "dots")].get("est_step_seconds")
    assert len(found.tried) == len(rows)  # a setting decided again replaces its row


def test_a_budget_stops_the_search_with_the_best_found_so_far(tiny_configs, tpu_slice, tmp_path):
    def slow_log(line):
        if "compiled" in line:
            time.sleep(1.5)  # the budget passes while the first row is reported

    found = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), budget_seconds=1.0,
                          log=slow_log)
    assert found.stopped == "budget" and found.best is not None and found.best["by_model"] == "fits"
    summary = search.search_summary(found)
    assert summary.startswith("STOPPED EARLY at the budget") and "best so far: mesh" in summary


def test_ctrl_c_stops_the_search_with_the_best_found_so_far(tiny_configs, tpu_slice, tmp_path):
    def interrupt(line):
        if " est " in line:
            raise KeyboardInterrupt

    found = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), log=interrupt)
    assert found.stopped == "interrupted" and found.best["est_step_seconds"] > 0
    assert os.listdir(tmp_path)  # what was compiled stays cached
    assert search.search_summary(found).startswith("STOPPED EARLY (Ctrl-C)")


def test_rows_show_xla_beside_the_model_or_the_model_alone():
    row = {"mesh_shape": [1, 4, 1], "microbatches": 2, "remat": "none", "scan_layers": True, "fits": True,
           "headroom": 0.5, "bytes_per_chip": 2.0e9, "model_bytes": 2.5e9, "est_step_seconds": 0.25, "est_mfu": 0.5}
    assert search.format_row(row) == ("mesh (1, 4, 1) micro   2 remat none scan y  fits     2.0 GB (model 2.5)"
                                      "  est 0.250 s/step, MFU 50%")
    by_model = dict(row, fits=None, bytes_per_chip=None, by_model="no", est_step_seconds=None)
    assert search.format_row(by_model) == "mesh (1, 4, 1) micro   2 remat none scan y  OOM      2.5 GB by the footprint model"
