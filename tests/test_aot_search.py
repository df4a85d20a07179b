"""`celerity compile --search`: the fastest setting that fits, and what it tried."""

import os

import pytest

from celerity_jax.aot import search
from celerity_jax.aot.cache import Cache


@pytest.mark.slow  # 40 s
def test_search_returns_a_setting_that_fits_and_what_it_tried(tmp_path, tiny_configs, tpu_slice):
    best, tried = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), log=lambda _: None)
    assert search.usable(best) and best in tried
    fastest = min(r["est_step_seconds"] for r in tried if search.usable(r))
    assert best["est_step_seconds"] <= (1 + search.SAME_ESTIMATE) * fastest
    assert {tuple(r["mesh_shape"]) for r in tried} >= {(1, 4, 1), (4, 1, 1)}
    assert {r["scan_layers"] for r in tried} == {True, False}
    cached = os.listdir(tmp_path)
    again, _ = search.search(tiny_configs(), tpu_slice, cache=Cache(str(tmp_path)), log=lambda _: None)
    assert again == best and os.listdir(tmp_path) == cached  # every compile came from the cache


def test_candidate_meshes_and_microbatch_sizes():
    assert search.candidate_meshes(8, 10) == [(1, 8, 1), (8, 1, 1), (1, 4, 2)]
    assert search.candidate_meshes(16, 16) == [(1, 16, 1), (16, 1, 1), (1, 8, 2), (1, 4, 4)]
    assert search.microbatch_seqs(44) == [1, 2, 4, 44]
    assert search.microbatch_seqs(1) == [1]


def test_search_skips_meshes_the_batch_does_not_split_over(tiny_configs, tpu_slice):
    best, tried = search.search(tiny_configs("RecipeConfig.batch_seqs = 6"), tpu_slice, log=lambda _: None)
    assert best is None and all("does not split over 4 data shards" in r["skipped"] for r in tried)
