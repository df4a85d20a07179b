import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.collapse import curves, surrogate
from celerity_jax.errors import ConfigError

N_BINS = 200
WIDTH = 5


def _normalized(sum_G, count_G, width: int, offset: float = 0.0):
    """A finished binned curve smoothed and divided by its own final (last-bin, smoothed) loss."""
    mean_G, _ = curves.smooth(sum_G, count_G, width)
    return curves.normalize(mean_G, mean_G[-1], offset)


def _clean(steps=2000, b=0.1, q=1.0, final=3.0):
    return surrogate.sample_curve(jax.random.key(0), steps, b, q, final, 0.0)


def test_binning_and_smoothing_match_a_direct_computation():
    frac_T = np.array([0.0, 0.01, 0.012, 0.5, 0.999, 1.0])
    loss_T = np.array([4.0, 3.0, np.nan, 2.0, 1.5, 1.0])
    sum_G, count_G = curves.bin_curve(frac_T, loss_T, 10)
    np.testing.assert_allclose(sum_G, [7.0, 0, 0, 0, 0, 2.0, 0, 0, 0, 2.5])
    np.testing.assert_allclose(count_G, [2, 0, 0, 0, 0, 1, 0, 0, 0, 2])  # the NaN is skipped
    mean_G, steps_G = curves.smooth(sum_G, count_G, 3)
    np.testing.assert_allclose(np.asarray(mean_G)[[0, 1, 4, 5, 6, 9]], [3.5, 3.5, 2.0, 2.0, 2.0, 1.25])
    assert np.isnan(mean_G[2]) and steps_G[2] == 0
    assert int(curves.last_bin(count_G)) == 9 and int(curves.last_bin(jnp.zeros(4))) == -1


def test_normalization_plain_and_offset():
    frac_T, loss_T = _clean()
    l_G = _normalized(*curves.bin_curve(frac_T, loss_T, N_BINS), WIDTH)
    assert float(l_G[-1]) == pytest.approx(1.0)
    assert float(l_G[N_BINS // 5]) > 1.05  # t̂ = 0.2 sits well above the end
    assert float(curves.normalize(3.0, 2.0, offset=1.0)) == pytest.approx(2.0)


def test_early_align_recovers_the_divisor_and_its_noise():
    frac_T, clean_T = _clean()
    sum_G, count_G = curves.bin_curve(frac_T, clean_T, N_BINS)
    ref_G = _normalized(sum_G, count_G, WIDTH)
    final = 0.8 * float(curves.smooth(sum_G, count_G, WIDTH)[0][-1])  # L_T is the smoothed last bin
    # the reference of another size: same shape, different final loss
    exact = curves.early_align(*curves.bin_curve(frac_T, clean_T * 0.8, N_BINS), ref_G, (0.25, 0.5))
    assert float(exact.final) == pytest.approx(final, rel=1e-5)
    assert final == pytest.approx(0.8 * float(clean_T[-1]), rel=2e-3)

    noise = 0.03
    rng = np.random.default_rng(1)
    noisy_KxT = np.asarray(clean_T) * 0.8 * (1.0 + noise * rng.standard_normal((100, clean_T.shape[0])))
    align = jax.jit(jax.vmap(lambda l_T: curves.early_align(*curves.bin_curve(frac_T, l_T, N_BINS), ref_G,
                                                            (0.25, 0.5))))(noisy_KxT)
    assert np.median(align.noise) == pytest.approx(noise, rel=0.1)
    # the reported error is the real scatter of the prediction
    assert np.std(align.log_scale) == pytest.approx(np.mean(align.log_scale_err), rel=0.25)
    assert np.mean(align.final) == pytest.approx(final, rel=2e-3)


def test_prediction_error_falls_as_more_of_the_run_is_seen():
    frac_T, clean_T = _clean()
    ref_G = _normalized(*curves.bin_curve(frac_T, clean_T, N_BINS), WIDTH)
    rng = np.random.default_rng(2)
    noisy_KxT = np.asarray(clean_T) * (1.0 + 0.05 * rng.standard_normal((100, clean_T.shape[0])))

    @jax.jit
    def error(seen):
        keep_T = frac_T <= seen
        align = jax.vmap(lambda l_T: curves.early_align(
            *curves.bin_curve(frac_T, jnp.where(keep_T, l_T, jnp.nan), N_BINS), ref_G, (0.1, seen)))(noisy_KxT)
        return jnp.mean(jnp.abs(align.final / clean_T[-1] - 1.0))

    errors = [float(error(f)) for f in (0.15, 0.3, 0.6, 0.9)]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[0] > 2 * errors[-1]


def test_early_align_with_offset_predicts_the_final_loss():
    frac_T, clean_T = _clean()
    l0 = 1.5
    ref_G = _normalized(*curves.bin_curve(frac_T, clean_T, N_BINS), WIDTH, offset=l0)
    sum_G, count_G = curves.bin_curve(frac_T, l0 + (clean_T - l0) * 0.7, N_BINS)
    align = curves.early_align(sum_G, count_G, ref_G, (0.25, 0.5), offset=l0)
    assert float(align.final) == pytest.approx(l0 + (float(clean_T[-1]) - l0) * 0.7, rel=1e-3)


def test_residuals_are_zero_on_the_reference_and_see_a_drift():
    frac_T, clean_T = _clean()
    sum_G, count_G = curves.bin_curve(frac_T, clean_T, N_BINS)
    ref_G = _normalized(sum_G, count_G, WIDTH)
    align = curves.early_align(sum_G, count_G, ref_G, (0.25, 0.5))
    r_G, sigma_G, l_G = curves.residuals(sum_G, count_G, ref_G, align, WIDTH)
    assert float(jnp.max(jnp.abs(r_G))) < 1e-4
    drifted_T = clean_T * (1.0 + 0.05 * jnp.maximum(frac_T - 0.6, 0.0))
    sum_G, count_G = curves.bin_curve(frac_T, drifted_T, N_BINS)
    r_G, _, _ = curves.residuals(sum_G, count_G, ref_G, curves.early_align(sum_G, count_G, ref_G, (0.25, 0.5)),
                                 WIDTH)
    assert float(jnp.max(jnp.abs(r_G[: N_BINS // 2]))) < 1e-4
    assert float(r_G[-1]) == pytest.approx(0.02 * float(ref_G[-1]), rel=0.1)


def test_collapse_quality_and_supercollapse():
    frac_G = curves.bin_centers(N_BINS)
    base_G = 1.0 + 0.5 * (1.0 - frac_G)
    family_KxG = np.stack([base_G, base_G + 0.02, base_G - 0.02])
    q = curves.collapse_quality(family_KxG, frac_G)
    assert float(q["mean_abs_dev"]) == pytest.approx(0.04 / 3, rel=1e-5)
    assert float(q["mean_range"]) == pytest.approx(0.04, rel=1e-5)
    assert float(q["max_range"]) == pytest.approx(0.04, rel=1e-5)

    seeds_KxRxG = base_G + 0.01 * np.random.default_rng(3).standard_normal((4, 6, N_BINS))
    tight = curves.supercollapse(seeds_KxRxG, frac_G)
    assert float(tight["ratio"]) < 1.0 and float(tight["frac_below"]) > 0.8
    drift_K = np.array([0.0, 0.02, 0.04, 0.06])[:, None, None]
    loose = curves.supercollapse(seeds_KxRxG + drift_K, frac_G)
    assert float(loose["ratio"]) > 1.5
    seeds_KxRxG[0, 3:] = np.nan  # fewer seeds for one size
    assert np.isfinite(float(curves.supercollapse(seeds_KxRxG, frac_G)["sigma"]))


FAMILY_BINS, FAMILY_WIDTH, FAMILY_STEPS = 200, 11, 1500
REF_SIZES = (1e5, 2e5, 4e5)


def _family_run(n: float, seed: int, noise: float = 0.02):
    """A member of a drifting family: the surrogate's b grows with N, the final loss falls."""
    return surrogate.sample_curve(jax.random.key(seed), FAMILY_STEPS, 0.1 * (n / 1e5)**0.15, 1.0,
                                  4.0 * (n / 1e5)**-0.1, noise)


def _family_normalized(frac_T, loss_T):
    return np.asarray(_normalized(*curves.bin_curve(frac_T, loss_T, FAMILY_BINS), FAMILY_WIDTH))


def test_family_curve_is_exact_on_a_log_linear_family_and_a_mean_for_one_size():
    frac_G = curves.bin_centers(FAMILY_BINS)
    shape_G, slope_G = 0.3 * (1.0 - frac_G), 0.02 * (1.0 - frac_G)
    sizes = np.array([1e6, 3e6, 1e7])
    refs_KxG = np.exp(shape_G + slope_G * np.log(sizes)[:, None])
    np.testing.assert_allclose(curves.family_curve(refs_KxG, sizes, 1e8),
                               np.exp(shape_G + slope_G * np.log(1e8)), rtol=1e-5)
    same = curves.family_curve(refs_KxG[:2], np.array([1e6, 1e6]), 1e8)
    np.testing.assert_allclose(same, np.exp(np.log(refs_KxG[:2]).mean(axis=0)), rtol=1e-5)


def test_family_aware_beats_single_reference_on_a_drifting_family():
    refs_KxG = np.stack([np.mean([_family_normalized(*_family_run(n, 100 + 10 * k + s)) for s in range(2)], axis=0)
                         for k, n in enumerate(REF_SIZES)])
    errors = {"single": [], "family": []}
    for target in (8e5, 1.6e6):
        family_G = curves.family_curve(refs_KxG, np.array(REF_SIZES), target)
        frac_T, clean_T = _family_run(target, 0, noise=0.0)
        true_final = float(curves.smooth(*curves.bin_curve(frac_T, clean_T, FAMILY_BINS), FAMILY_WIDTH)[0][-1])
        for seed in range(4):
            frac_T, loss_T = _family_run(target, seed)
            for seen in (0.3, 0.5):
                partial = curves.bin_curve(frac_T, np.where(np.asarray(frac_T) <= seen, loss_T, np.nan), FAMILY_BINS)
                for name, ref_G in (("single", refs_KxG[-1]), ("family", family_G)):
                    final = float(curves.early_align(*partial, ref_G, (0.1, seen)).final)
                    errors[name].append(abs(final / true_final - 1.0))
    single, fam = np.mean(errors["single"]), np.mean(errors["family"])
    assert fam < 0.6 * single, (fam, single)
    assert fam < 0.01


def test_predictions_from_one_size_equal_single_reference_alignment():
    ref_G = _family_normalized(*_family_run(4e5, 7))
    frac_T, loss_T = _family_run(8e5, 8)
    binned = curves.bin_curve(frac_T, loss_T, FAMILY_BINS)
    one = curves.family_curve(ref_G[None], np.array([4e5]), 8e5)
    assert float(curves.early_align(*binned, one, (0.25, 0.5)).final) == pytest.approx(
        float(curves.early_align(*binned, ref_G, (0.25, 0.5)).final), rel=1e-6)


def _python_ema(losses, decay: float) -> list[float]:
    """The recurrence written out in plain Python floats, one loss at a time."""
    value = weight = 0.0
    out = []
    for loss in losses:
        if math.isfinite(loss):
            weight = decay * weight + (1 - decay)
            value = decay * value + (1 - decay) * loss
        out.append(value / weight if weight else math.nan)
    return out


def test_loss_ema_is_the_bias_corrected_ema_of_the_finite_losses():
    loss_T = 2.0 + np.random.default_rng(4).random(300)
    loss_T[[0, 57, 58, 299]] = [np.nan, np.inf, np.nan, np.nan]  # skipped steps leave the EMA unchanged
    ema_T, carry = curves.loss_ema(loss_T, 0.98)
    np.testing.assert_array_equal(ema_T, _python_ema(loss_T, 0.98))  # bit for bit, NaN before the first
    assert np.isnan(ema_T[0]) and ema_T[1] == loss_T[1] and ema_T[58] == ema_T[56] and ema_T[-1] == ema_T[-2]
    assert carry[0] / carry[1] == ema_T[-1]


def test_loss_ema_continues_across_chunks_exactly():
    loss_T = 2.0 + np.random.default_rng(5).random(500)
    loss_T[100:130] = np.nan
    whole_T, whole_carry = curves.loss_ema(loss_T, 0.9)
    carry, parts = (0.0, 0.0), []
    for chunk in np.array_split(loss_T, [1, 7, 100, 110, 130, 131, 420]):  # one chunk holds only NaNs
        part_T, carry = curves.loss_ema(chunk, 0.9, carry)
        parts.append(part_T)
    np.testing.assert_array_equal(np.concatenate(parts), whole_T)
    assert carry == whole_carry
    only_nan_T, same = curves.loss_ema(np.full(3, np.nan), 0.9, carry)
    assert same == carry and np.all(only_nan_T == whole_T[-1])
    assert np.isnan(curves.loss_ema([np.nan], 0.9)[0][0])


def _family(shift_K, seeds=3, noise=0.01, n_bins=50, rng_seed=0):
    """K sizes × `seeds` curves: a shared shape, each size shifted by shift_K, each seed with its own offset and
    wiggle of std `noise`."""
    rng = np.random.default_rng(rng_seed)
    frac_G = curves.bin_centers(n_bins)
    shape_G = 1 + 0.3 * (1 - frac_G) ** 2
    k = len(shift_K)
    return frac_G, (shape_G + np.asarray(shift_K)[:, None, None]
                    + noise * rng.standard_normal((k, seeds, 1)) + 0.1 * noise * rng.standard_normal((k, seeds, n_bins)))


def test_family_measures_see_a_steady_drift_that_delta_over_sigma_misses():
    n_K = 1e5 * 2.0 ** np.arange(5)
    drift_K = 0.004 * np.log(n_K / n_K[0])  # 0.011 over 16× in N, 0.003 between neighbours: σ's size
    frac_G, drifting = _family(drift_K, noise=0.003)
    m = curves.family_measures(drifting, n_K, frac_G)
    assert m["delta_over_sigma"] < 1.5
    assert abs(m["trend_slope"] - 0.004) < 3 * m["trend_se"] and m["trend"] > 3
    assert m["floor"] == pytest.approx(math.sqrt(4 / 15))  # √((K−1)/(K·R)), K = 5 sizes, R = 3 seeds
    assert m["mae_by_size"][0] > m["mae_by_size"][2] < m["mae_by_size"][4]  # the middle sits on the mean
    flat = curves.family_measures(_family(np.zeros(5), noise=0.003, rng_seed=1)[1], n_K, frac_G)
    assert abs(flat["trend"]) < 3 and flat["delta_over_sigma"] < 2 * flat["floor"]
    assert flat["mae"] < m["mae"]


def test_family_measures_seed_floor_and_refusals():
    assert curves.supercollapse_floor([2, 2, 2]) == pytest.approx(math.sqrt(2 / 6))
    assert curves.supercollapse_floor([1, 3]) == pytest.approx(math.sqrt(0.5 * (1 + 1 / 3) / 2))
    frac_G, fam = _family([0.0, 0.01], seeds=1)
    with pytest.raises(ConfigError, match="two seeds"):
        curves.family_measures(fam, [1e5, 2e5], frac_G)
    frac_G, fam = _family([0.0, 0.01])
    with pytest.raises(ConfigError, match="same N"):
        curves.family_measures(fam, [1e5, 1e5], frac_G)
    # A size with a missing seed (NaN row) is measured on the seeds it has; a NaN outside the range costs nothing.
    fam[1, 2] = np.nan
    fam[0, 0, 0] = np.nan  # t̂ = 0.01, below the range's 0.2
    assert curves.family_measures(fam, [1e5, 2e5], frac_G)["seeds"] == [3, 2]
    with pytest.raises(ConfigError, match="one N per size"):
        curves.family_measures(fam, [1e5, 2e5, 4e5], frac_G)
