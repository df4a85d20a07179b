import dataclasses

import numpy as np
import pytest

from celerity_jax import coordcheck

FULL = coordcheck.CoordCheckConfig()  # the full ladder: widths 64..512 at depth 2, depths 2..16 at width 64
# The same check on the ends of a 4x width range and a 4x depth range, to fit the default suite.
QUICK = dataclasses.replace(FULL, widths=(64, 256), depths=(2, 8))


def _results(cc):
    out = coordcheck.run(cc, modes=("completep",), sweeps=("width", "depth"))
    out.update(coordcheck.run(cc, modes=("standard",), sweeps=("width",)))
    return out


def _check(results, cc):
    for sweep, sizes in (("width", cc.widths), ("depth", cc.depths)):
        res = results["completep"][sweep]
        assert res["sizes"] == list(sizes) and res["residual_rms"].shape == (len(sizes), cc.steps + 1)
        assert np.all(res["loss"][:, -1] < 0.5 * res["loss"][:, 0])  # the models did train
        for q in coordcheck.QUANTITIES:
            assert coordcheck.spread(res[q][:, -1]) < 1.6, (sweep, q, res[q][:, -1])
    standard = results["standard"]["width"]
    for q in coordcheck.QUANTITIES:
        assert np.all(np.diff(standard[q][:, -1]) > 0), (q, standard[q][:, -1])
    assert coordcheck.spread(standard["residual_rms"][:, -1]) > 5 * coordcheck.spread(
        results["completep"]["width"]["residual_rms"][:, -1])


@pytest.fixture(scope="module")
def quick_results():
    return _results(QUICK)


def test_completep_is_stable_and_standard_grows_with_width(quick_results):
    _check(quick_results, QUICK)


@pytest.mark.slow
def test_full_ladder():
    assert FULL.widths == (64, 128, 256, 512) and FULL.depths == (2, 4, 8, 16) and FULL.steps == 10
    _check(_results(FULL), FULL)


@pytest.mark.slow
@pytest.mark.parametrize("router, k", [("topk", 2), ("hash", 1)])
def test_a_mixture_of_experts_is_stable_under_completep_too(router, k):
    cc = dataclasses.replace(QUICK, n_experts=4, router=router, experts_per_token=k)
    assert coordcheck.model_config(cc, "completep", 64, 2).n_experts == 4
    _check(_results(cc), cc)


def test_plot_writes_the_figure(quick_results, tmp_path):
    coordcheck.plot(quick_results, str(tmp_path / "cc.png"))
    assert (tmp_path / "cc.png").stat().st_size > 10_000


def test_batch_is_fixed_and_in_vocab():
    a, b = coordcheck.batch_tokens(QUICK), coordcheck.batch_tokens(QUICK)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (QUICK.batch_seqs, QUICK.seq_len + 1) and a.min() >= 0 and a.max() < QUICK.vocab_size
