import dataclasses
import os

import jax
import numpy as np
import pytest

from celerity_jax.collapse import compare, curves, files, reference, surrogate
from celerity_jax.collapse.controls import Controls
from celerity_jax.collapse.types import Curve
from celerity_jax.errors import ConfigError

N_BINS, WIDTH, STEPS = 100, 5, 800


def _run(n: float, seed: int, b: float = 0.1, fault: float = 0.0) -> Curve:
    frac_T, loss_T = surrogate.sample_curve(jax.random.key(seed), STEPS, b, 1.0, 4.0 * (n / 1e5)**-0.1, 0.01)
    loss_T = np.asarray(loss_T, float) * (1.0 + fault * np.maximum(np.asarray(frac_T) - 0.6, 0.0))
    return Curve(f"n{n:g}_s{seed}", f"runs/n{n:g}_s{seed}/curve.csv", np.arange(1.0, STEPS + 1), loss_T,
                 np.asarray(frac_T, float), STEPS, "plan", Controls(n, 20.0, 0.17, "d2z", 0.1))


def test_compare_family_quality_and_supercollapse():
    runs = [_run(n, 10 * k + s) for k, n in enumerate((1e5, 2e5, 4e5)) for s in range(2)]
    fam = compare.compare_family(runs, N_BINS, WIDTH)
    normalized_KxG = np.stack([curves.normalize_run(r, N_BINS, WIDTH)[0] for r in runs])
    np.testing.assert_allclose(fam.normalized_KxG, normalized_KxG)
    assert fam.baseline == "family mean"
    np.testing.assert_allclose(fam.residual_KxG, normalized_KxG - normalized_KxG.mean(axis=0), atol=1e-7)
    assert fam.quality["mean_abs_dev"] == pytest.approx(
        float(curves.collapse_quality(normalized_KxG, curves.bin_centers(N_BINS))["mean_abs_dev"]))
    assert "supercollapse" in fam.quality and fam.quality["supercollapse"]["sigma"] > 0
    assert [row["n_params"] for row in fam.rows] == [r.controls.n_params for r in runs]
    keep_G = fam.frac_G >= 0.2
    assert fam.rows[0]["mae"] == pytest.approx(np.abs(fam.residual_KxG[0, keep_G]).mean())
    with pytest.raises(ConfigError, match="needs finished runs"):
        compare.compare_family([dataclasses.replace(runs[0], total_steps=2 * STEPS)], N_BINS, WIDTH)


def test_compare_against_references_reports_alert_onsets(tmp_path):
    path = os.path.join(tmp_path, "ref.json")
    files.save_reference(reference.reference_from_curves([_run(1e5, 1), _run(1e5, 2)], N_BINS, WIDTH), path)
    runs = [_run(1e5, 3), _run(1e5, 4, fault=0.2)]
    fam = compare.compare_family(runs, N_BINS, WIDTH, references=[path])
    assert fam.baseline == "reference" and fam.rows[0]["alert_onset_frac"] is None
    assert 0.6 < fam.rows[1]["alert_onset_frac"] < 0.9
    assert fam.rows[1]["max_abs_residual"] > 3 * fam.rows[0]["max_abs_residual"]

    figure = os.path.join(tmp_path, "fig.png")
    compare.plot_families({"clean": compare.compare_family(runs[:1], N_BINS, WIDTH), "with fault": fam}, figure)
    assert os.path.getsize(figure) > 10_000 and sorted(os.listdir(tmp_path)) == ["fig.png", "ref.json"]


def test_figure_labels_name_the_run_for_either_loss_file():
    from celerity_jax.collapse.compare import _label

    assert [_label(p) for p in ("runs/d64/curve.csv", "runs/d64/eval.csv", "curves/d80.csv", "runs/tb")] == [
        "d64", "d64", "d80.csv", "tb"]
