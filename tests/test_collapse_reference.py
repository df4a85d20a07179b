import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from celerity_jax.collapse import curves, files, reference, surrogate
from celerity_jax.collapse.config import CurveGrid, MonitorConfig
from celerity_jax.collapse.controls import Controls
from celerity_jax.collapse.types import Curve, Reference
from celerity_jax.errors import ConfigError

N_BINS, WIDTH, STEPS = 200, 11, 1000
CONTROLS = Controls(n_params=1e5, tpp=20.0, tau=0.17, schedule="d2z", warmup_frac=0.1)


def _curve(seed: int, controls=CONTROLS, b: float = 0.1, final: float = 3.0, steps: int = STEPS) -> Curve:
    frac_T, loss_T = surrogate.sample_curve(jax.random.key(seed), STEPS, b, 1.0, final, 0.01)
    step_T = np.arange(1, STEPS + 1, dtype=float)
    return Curve(f"seed{seed}", f"run{seed}/curve.csv", step_T[:steps], np.asarray(loss_T, float)[:steps],
                 np.asarray(frac_T, float)[:steps], STEPS, "plan", controls)


def test_reference_averages_seeds_and_round_trips(tmp_path):
    runs = [_curve(0), _curve(1, final=3.3)]
    ref = reference.reference_from_curves(runs, N_BINS, WIDTH)
    each_KxG = [np.asarray(curves.normalize(mean_G, mean_G[-1])) for mean_G in
                (curves.smooth(*curves.bin_curve(r.frac_T, r.loss_T, N_BINS), WIDTH)[0] for r in runs)]
    np.testing.assert_allclose(ref.normalized_G, np.mean(each_KxG, axis=0), rtol=1e-6)
    np.testing.assert_allclose(ref.seed_std_G, np.std(each_KxG, axis=0, ddof=1), rtol=1e-5, atol=1e-7)
    assert ref.final_loss == pytest.approx(3.15, rel=0.01) and ref.provenance["n_seeds"] == 2

    path = os.path.join(tmp_path, "ref.json")
    files.save_reference(ref, path)
    loaded = files.load_reference(path)
    np.testing.assert_allclose(loaded.normalized_G, ref.normalized_G, rtol=1e-6)
    np.testing.assert_allclose(loaded.frac_G, curves.bin_centers(N_BINS))
    assert loaded.controls == CONTROLS and loaded.source == path and loaded.provenance["sources"] == [
        "run0/curve.csv", "run1/curve.csv"]
    assert loaded.provenance["total_steps"] == [STEPS, STEPS]


def test_reference_refuses_mixed_controls_partial_runs_and_bad_offsets():
    other = _curve(1, dataclasses.replace(CONTROLS, tau=0.35))
    with pytest.raises(ConfigError, match=r"run1/curve.csv: controls differ from run0/curve.csv \(tau 0.35 vs 0.17\)"):
        reference.reference_from_curves([_curve(0), other], N_BINS, WIDTH)
    assert reference.reference_from_curves([_curve(0), other], N_BINS, WIDTH, force=True).provenance["n_seeds"] == 2
    with pytest.raises(ConfigError, match="stops at step 500 of 1000; this needs finished runs"):
        reference.reference_from_curves([_curve(0, steps=500)], N_BINS, WIDTH)
    with pytest.raises(ConfigError, match="offset L0 = 5.0 is not below the loss"):
        reference.reference_from_curves([_curve(0)], N_BINS, WIDTH, offset=5.0)
    with pytest.raises(ConfigError, match="leave gaps"):
        reference.reference_from_curves([_curve(0)], 20 * STEPS, 3)


def test_reference_from_surrogate():
    constants = surrogate.SurrogateConstants(0.05, -0.3, 2.0, -0.2)
    ref = reference.reference_from_surrogate(constants, CONTROLS, N_BINS, "s.json")
    eta_G, eta_end = surrogate.schedule_on_grid(ref.frac_G, "d2z", 0.1)
    np.testing.assert_allclose(ref.normalized_G, surrogate.surrogate_curve(
        ref.frac_G, eta_G, eta_end, constants.b(0.17), constants.q(20.0)), rtol=1e-6)
    assert ref.provenance["kind"] == "surrogate"
    with pytest.raises(ConfigError, match=r"needs the controls \['tau'\]"):
        reference.reference_from_surrogate(constants, dataclasses.replace(CONTROLS, tau=None), N_BINS)


def _saved(tmp_path, name: str, controls: Controls, b: float = 0.1) -> str:
    path = os.path.join(tmp_path, name)
    files.save_reference(reference.reference_from_curves([_curve(0, controls, b=b)], N_BINS, WIDTH), path)
    return path


def test_reference_curve_is_family_aware_across_sizes(tmp_path):
    small = files.load_reference(_saved(tmp_path, "s.json", CONTROLS, b=0.1))
    large = files.load_reference(_saved(tmp_path, "l.json", dataclasses.replace(CONTROLS, n_params=1e6), b=0.2))
    frac_G = curves.bin_centers(N_BINS)
    np.testing.assert_allclose(reference.reference_curve([small, large], frac_G, 1e6), large.normalized_G, rtol=1e-5)
    mid = np.asarray(reference.reference_curve([small, large], frac_G, np.sqrt(1e5 * 1e6)))
    np.testing.assert_allclose(mid, np.sqrt(small.normalized_G * large.normalized_G), rtol=1e-5)
    np.testing.assert_allclose(reference.reference_curve([small], frac_G[::2]), small.normalized_G[::2], rtol=1e-5)


def test_reference_from_the_default_surrogate_is_a_valid_curve(tmp_path):
    with open(files.default_surrogate_path()) as f:
        grid = json.load(f)["provenance"]["grid"]
    inside = dataclasses.replace(CONTROLS, tau=float(np.median(grid["taus"])), tpp=float(np.median(grid["tpps"])))
    ref = reference.reference_from_surrogate(files.default_surrogate(), inside, N_BINS, "default")
    path = os.path.join(tmp_path, "ref.json")
    files.save_reference(ref, path)
    loaded = files.load_reference(path)  # validates: increasing grid, finite positive values
    assert loaded.normalized_G[-1] == pytest.approx(1.0, abs=0.01)
    after_warmup_G = loaded.normalized_G[loaded.frac_G > 0.2]
    assert np.all(np.isfinite(after_warmup_G)) and after_warmup_G.max() < 3.0


def test_a_surrogate_that_overflows_far_from_its_fit_is_refused():
    steep = surrogate.SurrogateConstants(0.1, 0.0, 4.0, 2.0)  # q = 1600 at TPP 20: (η + 0.1)^q overflows
    with pytest.raises(ConfigError, match="no finite positive curve at τ = 0.17, TPP = 20"):
        reference.reference_from_surrogate(steep, CONTROLS, N_BINS, "steep.json")


def test_reference_on_grid_loads_checks_and_combines(tmp_path):
    cfg = MonitorConfig(n_bins=500)
    controls = Controls(n_params=1e5, tpp=20.0, tau=0.17, schedule="d2z", warmup_frac=0.1)
    ref = Reference(curves.bin_centers(100), np.linspace(1.5, 1.0, 100), None, controls, 0.0, 3.0, {})
    path = os.path.join(tmp_path, "ref.json")
    files.save_reference(ref, path)
    ref_G, notes = reference.reference_on_grid([path], cfg, dataclasses.replace(controls, n_params=1e6), "run")
    assert ref_G.shape == (cfg.n_bins,) and notes == []
    np.testing.assert_allclose(ref_G, np.interp(curves.bin_centers(cfg.n_bins), ref.frac_G, ref.normalized_G),
                               rtol=1e-5)
    same_G, _ = reference.reference_on_grid([path], CurveGrid(n_bins=500), controls, "run")
    np.testing.assert_array_equal(same_G, ref_G)  # a MonitorConfig stands for its grid
    with pytest.raises(ConfigError, match=r"tau 0.17 vs 0.05"):
        reference.reference_on_grid([path], cfg, dataclasses.replace(controls, tau=0.05), "run")
    with pytest.raises(ConfigError, match="offset L0 0 vs 0.5"):
        reference.reference_on_grid([path], CurveGrid(n_bins=500, offset=0.5), controls, "run")
    with pytest.raises(ConfigError, match="no reference given"):
        reference.reference_on_grid([], cfg, controls, "run")


def test_reference_on_grid_notes_an_unknown_n(tmp_path):
    small, large = _saved(tmp_path, "s.json", CONTROLS), _saved(tmp_path, "l.json",
                                                                 dataclasses.replace(CONTROLS, n_params=1e6))
    ref_G, notes = reference.reference_on_grid([small, large], CurveGrid(n_bins=N_BINS),
                                               dataclasses.replace(CONTROLS, n_params=None), "run")
    assert notes == ["N of run unknown: its reference is the mean over the references' sizes"]
    np.testing.assert_allclose(ref_G, reference.reference_curve([files.load_reference(small),
                                                                 files.load_reference(large)], curves.bin_centers(N_BINS)))


def test_nearest(tmp_path):
    def nearest(paths, n_params):
        return reference.nearest([files.load_reference(p) for p in paths], n_params).source

    paths = [_saved(tmp_path, f"n{n:g}.json", dataclasses.replace(CONTROLS, n_params=n)) for n in (1e5, 4e5, 1.6e6)]
    assert nearest(paths, 1e6) == paths[2] and nearest(paths, 1.9e5) == paths[0]
    assert nearest(paths, 2.1e5) == paths[1]
    assert nearest(paths[::-1], 2e5) == paths[1]  # equally near in log N: the first given
    unknown = _saved(tmp_path, "unknown.json", dataclasses.replace(CONTROLS, n_params=None))
    assert nearest([unknown] + paths, 1e6) == paths[2]  # unknown N counts only when nothing is known
    assert nearest([unknown, unknown], 1e6) == unknown


def _ref(name: str, controls: Controls, offset: float = 0.0) -> Reference:
    frac_G = (np.arange(10) + 0.5) / 10
    return Reference(frac_G, 2.0 - frac_G, None, controls, offset, 3.0, {}, name)


def test_check_controls_refuses_mismatches_unless_forced():
    refs = [_ref("a.json", CONTROLS), _ref("b.json", dataclasses.replace(CONTROLS, n_params=4e5))]
    assert reference.check_controls(refs, dataclasses.replace(CONTROLS, n_params=1e6), "run") == []
    with pytest.raises(ConfigError, match=r"a.json: tpp 20 vs 80 \(reference vs run\).*--force"):
        reference.check_controls(refs, dataclasses.replace(CONTROLS, tpp=80.0), "run")
    notes = reference.check_controls(refs, dataclasses.replace(CONTROLS, schedule="cosine"), "run", force=True)
    assert any("forced" in n and "schedule" in n for n in notes)
    assert any("not checked" in n for n in reference.check_controls(refs, Controls(), "run"))
    with pytest.raises(ConfigError, match="offset L0 0 vs 1"):
        reference.check_controls(refs, CONTROLS, "run", offset=1.0)
    odd = _ref("c.json", dataclasses.replace(CONTROLS, tau=0.5))
    with pytest.raises(ConfigError, match="between|vs .*a.json"):
        reference.check_controls([refs[0], odd], Controls(), "run")


def test_regime_notes_warn_about_references_from_short_runs(tmp_path):
    long_run = _curve(0)
    long_run = dataclasses.replace(long_run, step_T=long_run.step_T * 2, total_steps=2 * STEPS)
    long_ref = reference.reference_from_curves([long_run], N_BINS, WIDTH)  # 2,000 steps, 2,000,000 tokens
    short_ref = dataclasses.replace(reference.reference_from_curves([_curve(0)], N_BINS, WIDTH), source="short.json")
    assert reference.regime_notes([long_ref]) == []
    (line,) = reference.regime_notes([long_ref, short_ref])
    assert line.startswith("reference short.json (2,000,000 tokens, 1,000 steps): 1,000 steps (< 1,300): shorter "
                           "than the regime")
    assert "at least 1,300 steps and 650,000 tokens" in line
    # a reference from before its steps were recorded is checked on its tokens alone
    old = dataclasses.replace(short_ref, provenance={"kind": "curves"})
    assert reference.regime_notes([old]) == []
    few_tokens = dataclasses.replace(old, controls=dataclasses.replace(CONTROLS, n_params=1e4))
    (line,) = reference.regime_notes([few_tokens])
    assert line.startswith("reference short.json (200,000 tokens, steps unknown): 200,000 tokens (< 650,000)")
    surrogate_ref = reference.reference_from_surrogate(surrogate.SurrogateConstants(0.05, -0.3, 2.0, -0.2),
                                                       dataclasses.replace(CONTROLS, n_params=1e4), N_BINS)
    assert reference.regime_notes([surrogate_ref]) == []  # no run, no warning


def test_load_checked_returns_the_checked_references(tmp_path):
    paths = [_saved(tmp_path, f"n{n:g}.json", dataclasses.replace(CONTROLS, n_params=n)) for n in (1e5, 4e5)]
    refs, notes = reference.load_checked(paths, MonitorConfig(n_bins=N_BINS), CONTROLS, "run")
    assert [r.source for r in refs] == paths and notes == [] and refs[0].provenance["total_steps"] == [STEPS]
    with pytest.raises(ConfigError, match=r"tau 0.17 vs 0.05"):
        reference.load_checked(paths, CurveGrid(n_bins=N_BINS), dataclasses.replace(CONTROLS, tau=0.05), "run")
