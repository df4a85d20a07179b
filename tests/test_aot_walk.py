"""One mesh's walk in `compile --search`: the model decides where it is sure, a compile steps it down and on."""

import dataclasses

import pytest

from celerity_jax import recipe
from celerity_jax.aot import walk as walk_lib
from celerity_jax.aot.row import Row, Verdict


def test_microbatch_sizes():
    assert walk_lib.microbatch_seqs(44) == [1, 2, 4, 44]
    assert walk_lib.microbatch_seqs(1) == [1]


def _walk(configs, topology, mesh=(1, 4, 1)):
    return walk_lib.MeshWalk(configs, topology, mesh, recipe.make_plan(configs.model, configs.recipe))


def _compiled(walk, index, fits: bool) -> Row:
    gb = 1.0 if fits else 100.0
    return Row(walk.setting(index), fits=fits, headroom=0.9 if fits else None, bytes_per_chip=gb * 1e9)


def _settled(walk) -> list[tuple]:
    return [(r.setting.microbatches, r.setting.remat) for r in walk.settled]


def test_the_footprint_model_decides_where_it_is_sure(tiny_configs, tpu_slice):
    walk = _walk(tiny_configs("RecipeConfig.batch_seqs = 64"), tpu_slice)  # 16 per shard: sizes 1, 2, 4, 8, 16
    assert walk.sizes == [1, 2, 4, 8, 16]
    # the tiny model fits whole by far: the largest microbatch, without remat and without a compile; any remat
    # could only win with a larger microbatch, and there is none
    assert walk.compile_index is None and not walk.remats
    assert _settled(walk) == [(1, "none")] and walk.settled[0].by_model == Verdict.FITS


def test_a_size_the_model_is_unsure_of_is_compiled_and_the_walk_steps_down_and_on(tiny_configs, tpu_slice,
                                                                                  monkeypatch):
    monkeypatch.setattr(walk_lib, "SURE_FITS", 1e12)  # the model is never sure
    monkeypatch.setattr(walk_lib, "SLACK", 1e12)
    walk = _walk(tiny_configs("RecipeConfig.batch_seqs = 64"), tpu_slice)
    assert walk.compile_index == 4 and walk.remats[0] == "none"  # the largest microbatch first
    model = walk.model_bytes(4)
    walk.record(4, _compiled(walk, 4, fits=False))
    assert walk.rows == [dataclasses.replace(_compiled(walk, 4, fits=False), model_bytes=model)]
    assert walk.compile_index == 3  # one size down
    assert walk.ratio == pytest.approx(100e9 / model)  # the model scaled by XLA's bytes, for this remat
    walk.record(3, _compiled(walk, 3, fits=True))
    assert _settled(walk) == [(2, "none")] and walk.floor == 3
    # dots can only win above 8 sequences per shard
    assert walk.remats[0] == "dots" and walk.compile_index == 4
    walk.record(4, _compiled(walk, 4, fits=False))
    # nothing between: each remat that does not fit there is done, the next tries
    for remat in ("attention", "qkv"):
        assert walk.remats[0] == remat and walk.compile_index == 4
        walk.record(4, _compiled(walk, 4, fits=False))
    assert walk.remats[0] == "full" and walk.compile_index == 4
    walk.record(4, _compiled(walk, 4, fits=True))
    assert _settled(walk) == [(2, "none"), (1, "full")]
    assert walk.compile_index is None


def test_a_setting_its_check_rejects_is_walked_again_below(tiny_configs, tpu_slice, monkeypatch):
    walk = _walk(tiny_configs("RecipeConfig.batch_seqs = 64"), tpu_slice)
    assert _settled(walk) == [(1, "none")] and walk.settled[0].by_model == Verdict.FITS
    monkeypatch.setattr(walk_lib, "SURE_FITS", 1e12)  # from here on, the model is never sure
    monkeypatch.setattr(walk_lib, "SLACK", 1e12)
    again = walk.below(dataclasses.replace(walk.settled[0], by_model=None, bytes_per_chip=100e9))
    assert again.ratio == pytest.approx(100e9 / walk.settled[0].model_bytes)
    assert again.remats[0] == "none" and again.compile_index == 3  # under the size XLA rejected
    again.record(3, _compiled(again, 3, fits=True))
    # dots was never walked at the largest size (no remat fit there, by the model): now it is
    assert again.remats[0] == "dots" and again.compile_index == 4
    again.record(4, _compiled(again, 4, fits=True))
    assert _settled(again) == [(2, "none"), (1, "dots")]
    assert again.compile_index is None and not again.remats
