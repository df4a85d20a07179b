import jax
import numpy as np
import pytest

from celerity_jax.collapse import curves, family, surrogate

N_BINS, WIDTH, STEPS = 200, 11, 1500
REF_SIZES = (1e5, 2e5, 4e5)


def _run(n: float, seed: int, noise: float = 0.02):
    """A member of a drifting family: the surrogate's b grows with N, the final loss falls."""
    return surrogate.sample_curve(jax.random.key(seed), STEPS, 0.1 * (n / 1e5)**0.15, 1.0,
                                  4.0 * (n / 1e5)**-0.1, noise)


def _normalized(frac_T, loss_T):
    return np.asarray(curves.normalized_curve(*curves.bin_curve(frac_T, loss_T, N_BINS), WIDTH))


def test_family_curve_is_exact_on_a_log_linear_family_and_a_mean_for_one_size():
    frac_G = curves.bin_centers(N_BINS)
    shape_G, slope_G = 0.3 * (1.0 - frac_G), 0.02 * (1.0 - frac_G)
    sizes = np.array([1e6, 3e6, 1e7])
    refs_KxG = np.exp(shape_G + slope_G * np.log(sizes)[:, None])
    np.testing.assert_allclose(family.family_curve(refs_KxG, sizes, 1e8),
                               np.exp(shape_G + slope_G * np.log(1e8)), rtol=1e-5)
    same = family.family_curve(refs_KxG[:2], np.array([1e6, 1e6]), 1e8)
    np.testing.assert_allclose(same, np.exp(np.log(refs_KxG[:2]).mean(axis=0)), rtol=1e-5)


def test_family_aware_beats_single_reference_on_a_drifting_family():
    refs_KxG = np.stack([np.mean([_normalized(*_run(n, 100 + 10 * k + s)) for s in range(2)], axis=0)
                         for k, n in enumerate(REF_SIZES)])
    errors = {"single": [], "family": []}
    for target in (8e5, 1.6e6):
        family_G = family.family_curve(refs_KxG, np.array(REF_SIZES), target)
        frac_T, clean_T = _run(target, 0, noise=0.0)
        true_final = float(curves.smooth(*curves.bin_curve(frac_T, clean_T, N_BINS), WIDTH)[0][-1])
        for seed in range(4):
            frac_T, loss_T = _run(target, seed)
            for seen in (0.3, 0.5):
                partial = curves.bin_curve(frac_T, np.where(np.asarray(frac_T) <= seen, loss_T, np.nan), N_BINS)
                for name, ref_G in (("single", refs_KxG[-1]), ("family", family_G)):
                    final = float(curves.early_align(*partial, ref_G, (0.1, seen)).final)
                    errors[name].append(abs(final / true_final - 1.0))
    single, fam = np.mean(errors["single"]), np.mean(errors["family"])
    assert fam < 0.6 * single, (fam, single)
    assert fam < 0.01


def test_predictions_from_one_size_equal_single_reference_alignment():
    ref_G = _normalized(*_run(4e5, 7))
    frac_T, loss_T = _run(8e5, 8)
    binned = curves.bin_curve(frac_T, loss_T, N_BINS)
    one = family.family_curve(ref_G[None], np.array([4e5]), 8e5)
    assert float(curves.early_align(*binned, one, (0.25, 0.5)).final) == pytest.approx(
        float(curves.early_align(*binned, ref_G, (0.25, 0.5)).final), rel=1e-6)
