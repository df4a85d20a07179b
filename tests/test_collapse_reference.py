import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from celerity_jax.collapse import curves, reference, surrogate
from celerity_jax.collapse.loading import Controls, Curve
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
    each_KxG = [np.asarray(curves.normalized_curve(*curves.bin_curve(r.frac_T, r.loss_T, N_BINS), WIDTH))
                for r in runs]
    np.testing.assert_allclose(ref.normalized_G, np.mean(each_KxG, axis=0), rtol=1e-6)
    np.testing.assert_allclose(ref.seed_std_G, np.std(each_KxG, axis=0, ddof=1), rtol=1e-5, atol=1e-7)
    assert ref.final_loss == pytest.approx(3.15, rel=0.01) and ref.provenance["n_seeds"] == 2

    path = os.path.join(tmp_path, "ref.json")
    reference.save_reference(ref, path)
    loaded = reference.load_reference(path)
    np.testing.assert_allclose(loaded.normalized_G, ref.normalized_G, rtol=1e-6)
    np.testing.assert_allclose(loaded.frac_G, curves.bin_centers(N_BINS))
    assert loaded.controls == CONTROLS and loaded.source == path and loaded.provenance["sources"] == [
        "run0/curve.csv", "run1/curve.csv"]


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
    reference.save_reference(reference.reference_from_curves([_curve(0, controls, b=b)], N_BINS, WIDTH), path)
    return path


def test_check_controls_refuses_mismatches_unless_forced(tmp_path):
    refs = [reference.load_reference(_saved(tmp_path, "a.json", CONTROLS)),
            reference.load_reference(_saved(tmp_path, "b.json", dataclasses.replace(CONTROLS, n_params=4e5)))]
    assert reference.check_controls(refs, dataclasses.replace(CONTROLS, n_params=1e6), "run") == []
    with pytest.raises(ConfigError, match=r"a.json: tpp 20 vs 80 \(reference vs run\).*--force"):
        reference.check_controls(refs, dataclasses.replace(CONTROLS, tpp=80.0), "run")
    notes = reference.check_controls(refs, dataclasses.replace(CONTROLS, schedule="cosine"), "run", force=True)
    assert any("forced" in n and "schedule" in n for n in notes)
    assert any("not checked" in n for n in reference.check_controls(refs, Controls(), "run"))
    with pytest.raises(ConfigError, match="offset L0 0 vs 1"):
        reference.check_controls(refs, CONTROLS, "run", offset=1.0)
    odd = reference.load_reference(_saved(tmp_path, "c.json", dataclasses.replace(CONTROLS, tau=0.5)))
    with pytest.raises(ConfigError, match="between|vs .*a.json"):
        reference.check_controls([refs[0], odd], Controls(), "run")


def test_reference_curve_is_family_aware_across_sizes(tmp_path):
    small = reference.load_reference(_saved(tmp_path, "s.json", CONTROLS, b=0.1))
    large = reference.load_reference(_saved(tmp_path, "l.json", dataclasses.replace(CONTROLS, n_params=1e6), b=0.2))
    frac_G = curves.bin_centers(N_BINS)
    np.testing.assert_allclose(reference.reference_curve([small, large], frac_G, 1e6), large.normalized_G, rtol=1e-5)
    mid = np.asarray(reference.reference_curve([small, large], frac_G, np.sqrt(1e5 * 1e6)))
    np.testing.assert_allclose(mid, np.sqrt(small.normalized_G * large.normalized_G), rtol=1e-5)
    np.testing.assert_allclose(reference.reference_curve([small], frac_G[::2]), small.normalized_G[::2], rtol=1e-5)


GOOD = {"format": reference.FORMAT, "frac": [0.1, 0.2], "normalized_loss": [1.1, 1.0]}


@pytest.mark.parametrize("content, problem", [
    (bytes(range(256)), "not a JSON text file"),
    ('{"format": ', "not valid JSON"),
    ("[1, 2]", "holds an array, where a JSON object is expected"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    (json.dumps(dict(GOOD, format="other")), "format 'other', expected 'celerity-collapse-reference/1'"),
    (json.dumps(dict(GOOD, controls=[])), "the controls are an array, not a JSON object"),
    (json.dumps(dict(GOOD, controls={"tau": "fast"})), "'tau' = 'fast' is not a non-negative number"),
    (json.dumps({"format": reference.FORMAT, "frac": [0.1, 0.2]}), "the reference has no 'normalized_loss'"),
    (json.dumps(dict(GOOD, frac="abc")), "'frac' is not a list of finite numbers"),
    (json.dumps(dict(GOOD, frac=[0.1, None])), "'frac' is not a list of finite numbers"),
    (json.dumps(dict(GOOD, normalized_loss=[[1], [2]])), "'normalized_loss' is not a list of finite numbers"),
    (json.dumps(dict(GOOD, frac=[0.1, 0.05])), "'frac' must increase"),
    (json.dumps(dict(GOOD, seed_std=[0.1])), "'frac' must increase .* in length"),
    (json.dumps(dict(GOOD, offset="0")), "'offset' = '0' is not a finite number"),
])
def test_load_reference_refuses_malformed_files_in_one_line(tmp_path, content, problem):
    path = tmp_path / "ref.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=problem) as e:
        reference.load_reference(str(path))
    message = str(e.value)
    assert message.startswith(f"{path}: ") and "`celerity collapse reference`" in message and "\n" not in message


def test_reference_from_the_default_surrogate_is_a_valid_curve(tmp_path):
    grid = json.load(open(surrogate.default_surrogate_path()))["provenance"]["grid"]
    inside = dataclasses.replace(CONTROLS, tau=float(np.median(grid["taus"])), tpp=float(np.median(grid["tpps"])))
    ref = reference.reference_from_surrogate(surrogate.default_surrogate(), inside, N_BINS, "default")
    path = os.path.join(tmp_path, "ref.json")
    reference.save_reference(ref, path)
    loaded = reference.load_reference(path)  # validates: increasing grid, finite positive values
    assert loaded.normalized_G[-1] == pytest.approx(1.0, abs=0.01)
    after_warmup_G = loaded.normalized_G[loaded.frac_G > 0.2]
    assert np.all(np.isfinite(after_warmup_G)) and after_warmup_G.max() < 3.0


def test_surrogate_inputs_normalize_runs_and_select_curves():
    runs = [_curve(0), _curve(1, dataclasses.replace(CONTROLS, tau=0.35), b=0.2)]
    inputs = reference.surrogate_inputs(runs, N_BINS, WIDTH)
    assert inputs.curves_CxG.shape == inputs.eta_CxG.shape == (2, N_BINS)
    np.testing.assert_allclose(inputs.curves_CxG[0], reference.normalize_run(runs[0], N_BINS, WIDTH)[0])
    assert list(inputs.tau_C) == [0.17, 0.35] and inputs.info[1]["curve"] == "run1/curve.csv"
    second = inputs.take(np.array([False, True]))
    assert second.info == inputs.info[1:] and np.array_equal(second.curves_CxG, inputs.curves_CxG[1:])
    with pytest.raises(ConfigError, match=r"run0/curve.csv: the surrogate needs the controls \['tau'\]"):
        reference.surrogate_inputs([_curve(0, dataclasses.replace(CONTROLS, tau=None))], N_BINS, WIDTH)


def test_a_surrogate_that_overflows_far_from_its_fit_is_refused():
    steep = surrogate.SurrogateConstants(0.1, 0.0, 4.0, 2.0)  # q = 1600 at TPP 20: (η + 0.1)^q overflows
    with pytest.raises(ConfigError, match="no finite positive curve at τ = 0.17, TPP = 20"):
        reference.reference_from_surrogate(steep, CONTROLS, N_BINS, "steep.json")
