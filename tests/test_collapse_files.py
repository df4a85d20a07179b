import dataclasses
import json
import os
import time

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary import Writer
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from celerity_jax.collapse import files, surrogate
from celerity_jax.collapse.controls import Controls
from celerity_jax.collapse.types import Reference
from celerity_jax.errors import ConfigError

PLAN = {"n_params": 1.0e5, "tokens": 2.0e6, "steps": 100, "tau": 0.17, "schedule": "d2z", "warmup_steps": 10,
        "batch_tokens": 20000, "lr_hidden": 0.01}


def _write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def _csv(path: str, steps, losses, header="step,loss") -> str:
    return _write(path, header + "\n" + "".join(f"{s},{v}\n" for s, v in zip(steps, losses)))


def test_csv_with_sidecar(tmp_path):
    path = _csv(tmp_path / "run.csv", range(1, 51), np.linspace(4, 3, 50))
    _write(tmp_path / "run.json", json.dumps({"n_params": 2e5, "tpp": 20, "tau": 0.1, "schedule": "d2z",
                                               "warmup_frac": 0.1, "total_steps": 200}))
    curve = files.load_curve(str(path))
    assert curve.name == "run" and curve.total_steps == 200 and not curve.finished
    assert curve.controls == Controls(2e5, 20.0, 0.1, "d2z", 0.1)
    np.testing.assert_allclose(curve.frac_T, np.arange(1, 51) / 200)


def test_bare_csv_ends_at_its_last_step_and_total_steps_can_be_given(tmp_path):
    path = _csv(tmp_path / "c.csv", [0, 10, 20], [3.0, 2.5, 2.0])
    curve = files.load_curve(str(path))
    assert curve.finished and curve.total_steps == 20 and curve.total_from == "last step"
    assert curve.controls == Controls()
    partial = files.load_curve(str(path), total_steps=80)
    assert not partial.finished and partial.frac_T[-1] == 0.25


def test_run_directory_reads_plan_by_key(tmp_path):
    _write(tmp_path / "plan.json", json.dumps(PLAN))
    _write(tmp_path / "curve.csv", "step,tokens,frac,loss\n1,20000,0.01,3.0\n2,40000,0.02,2.9\n")
    curve = files.load_curve(str(tmp_path))
    assert curve.controls == Controls(1e5, 20.0, 0.17, "d2z", 0.1)
    assert curve.total_steps == 100 and curve.source.endswith("curve.csv")
    np.testing.assert_allclose(curve.frac_T, [0.01, 0.02])


def test_tensorboard_directory_with_restart_and_frac(tmp_path):
    run = tmp_path / "run"
    events = run / "tb"
    os.makedirs(events)
    _write(run / "plan.json", json.dumps(PLAN))
    writer = EventFileWriter(str(events))
    for step, loss in [(1, 3.0), (2, 2.9), (3, 9.9), (4, 2.7)]:
        values = [summary_pb2.Summary.Value(tag="train/loss", simple_value=loss),
                  summary_pb2.Summary.Value(tag="progress/frac", simple_value=step / 100)]
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)))
    writer.close()
    time.sleep(0.01)
    restarted = Writer(str(events))  # tensor-valued scalars, as tensorboard.summary writes them
    restarted.add_scalar("train/loss", 2.8, 3)
    restarted.close()
    curve = files.load_curve(str(events))
    np.testing.assert_allclose(curve.step_T, [1, 2, 3, 4])
    np.testing.assert_allclose(curve.loss_T, [3.0, 2.9, 2.8, 2.7], rtol=1e-6)  # the restart's step 3 wins
    assert curve.controls.tau == 0.17 and curve.total_steps == 100


@pytest.mark.parametrize("text, problem", [
    ("step,value\n1,3.0\n", r"lacks column\(s\) \['loss'\]"),
    ("step,loss\n1,3.0\n2,2.9\n2,2.8\n", "step 2 .* follows step 2: a duplicate step"),
    ("step,loss\n1,3.0\n5,2.9\n4,2.8\n", "step 4 .* follows step 5: decreasing step"),
    ("step,loss\n1,3.0\n2,nan\n", "loss at step 2 .* is nan"),
    ("step,loss\n1,3.0\n2,abc\n", "line 3: 'loss' is 'abc', not a number"),
    ("step,loss\n1,3.0\n2.5,2.9\n", r"line 3: 'step' is '2.5', not a whole number >= 0"),
    ("step,loss\n-1,3.0\n", "line 2: 'step' is '-1', not a whole number >= 0"),
    ("step,loss\n1e400,3.0\n", r"'step' is '1e400', not a whole number >= 0 \(and below 2\*\*63\)"),
    (f"step,loss\n{10**18},3.0\n{10**18},2.9\n", f"step {10**18} .* follows step {10**18}: a duplicate step"),
    ("", "empty file"),
    ("step,loss\n", "no data rows"),
    ("step,loss\n1,-1\n", "normalization needs positive losses"),
])
def test_bad_csv_is_refused_naming_file_and_problem(tmp_path, text, problem):
    path = _write(tmp_path / "bad.csv", text)
    with pytest.raises(ConfigError, match=problem) as e:
        files.load_curve(str(path))
    assert str(path) in str(e.value)


def test_total_steps_smaller_than_the_curve_and_bad_paths(tmp_path):
    path = _csv(tmp_path / "c.csv", [1, 2, 30], [3.0, 2.9, 2.8])
    with pytest.raises(ConfigError, match=r"c.csv: the total step count 20 is smaller than the curve.* last step is 30"):
        files.load_curve(str(path), total_steps=20)
    _write(tmp_path / "c.json", json.dumps({"total_steps": 10}))
    with pytest.raises(ConfigError, match="smaller than the curve"):
        files.load_curve(str(path))
    _write(tmp_path / "c.json", json.dumps({"tau": "fast"}))
    with pytest.raises(ConfigError, match=r"c.json: 'tau' = 'fast' is not a non-negative number"):
        files.load_curve(str(path))
    with pytest.raises(ConfigError, match="missing.txt does not exist; give a run"):
        files.load_curve(str(tmp_path / "missing.txt"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ConfigError, match="no curve.csv and no TensorBoard scalar"):
        files.load_curve(str(tmp_path / "empty"))


BINARY = bytes(range(256)) * 4


def test_steps_are_exact_integers_even_above_2_to_the_53(tmp_path):
    big = 10**18
    path = _csv(tmp_path / "big.csv", [big, big + 1, big + 2], [3.0, 2.9, 2.8])
    _write(tmp_path / "big.json", json.dumps({"total_steps": big + 10}))
    curve = files.load_curve(str(path))
    assert curve.step_T.tolist() == [big, big + 1, big + 2] and curve.total_steps == big + 10
    curve = files.load_curve(str(_csv(tmp_path / "f.csv", ["1e3", "2000.0"], [3.0, 2.9])))
    assert curve.step_T.tolist() == [1000, 2000]


def _refused_in_one_line(path, problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        files.load_curve(str(path))
    assert str(e.value).startswith(problem) and "\n" not in str(e.value)


def test_bad_curve_paths_and_files_are_one_line(tmp_path):
    _refused_in_one_line(tmp_path / "missing", f"CURVE {tmp_path / 'missing'} does not exist; give a run directory")
    notes = _write(tmp_path / "notes.txt", "x")
    _refused_in_one_line(notes, f"CURVE {notes} is not a run directory, a TensorBoard event directory or a curve")
    (tmp_path / "bin.csv").write_bytes(BINARY)
    _refused_in_one_line(tmp_path / "bin.csv", f"{tmp_path / 'bin.csv'}: not a text CSV")
    run = tmp_path / "run"
    run.mkdir()
    (run / "curve.csv").write_bytes(BINARY)
    _refused_in_one_line(run, f"{run / 'curve.csv'}: not a text CSV")
    _csv(run / "curve.csv", [1], [3.0])
    (run / "plan.json").write_bytes(BINARY)
    _refused_in_one_line(run, f"{run / 'plan.json'}: not a JSON text file")
    _write(run / "plan.json", "[1]")
    _refused_in_one_line(run, f"{run / 'plan.json'}: holds an array, where a JSON object is expected")


def test_an_unreadable_curve_is_refused(tmp_path):
    path = _csv(tmp_path / "c.csv", [1], [3.0])
    os.chmod(path, 0o200)
    if os.access(path, os.R_OK):
        pytest.skip("permissions do not restrict this user (root)")
    with pytest.raises(ConfigError, match="c.csv is not readable"):
        files.load_curve(str(path))


def _reference() -> Reference:
    frac_G = (np.arange(200) + 0.5) / 200
    return Reference(frac_G, 1.0 + 0.5 * (1.0 - frac_G), 0.01 * frac_G,
                           Controls(1e5, 20.0, 0.17, "d2z", 0.1), 0.0, 3.15,
                           {"kind": "curves", "sources": ["run0/curve.csv", "run1/curve.csv"], "n_seeds": 2})


def test_reference_round_trips(tmp_path):
    ref = _reference()
    path = os.path.join(tmp_path, "ref.json")
    files.save_reference(ref, path)
    loaded = files.load_reference(path)
    np.testing.assert_allclose(loaded.normalized_G, ref.normalized_G, rtol=1e-6)
    np.testing.assert_allclose(loaded.seed_std_G, ref.seed_std_G, rtol=1e-6)
    np.testing.assert_allclose(loaded.frac_G, ref.frac_G)
    assert loaded.controls == ref.controls and loaded.source == path and loaded.provenance == ref.provenance
    assert loaded.final_loss == 3.15 and loaded.offset == 0.0
    files.save_reference(dataclasses.replace(ref, seed_std_G=None), path)
    assert files.load_reference(path).seed_std_G is None


GOOD = {"format": files.REFERENCE_FORMAT, "frac": [0.1, 0.2], "normalized_loss": [1.1, 1.0]}


@pytest.mark.parametrize("content, problem", [
    (bytes(range(256)), "not a JSON text file"),
    ('{"format": ', "not valid JSON"),
    ("[1, 2]", "holds an array, where a JSON object is expected"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    (json.dumps(dict(GOOD, format="other")), "format 'other', expected 'celerity-collapse-reference/1'"),
    (json.dumps(dict(GOOD, controls=[])), "the controls are an array, not a JSON object"),
    (json.dumps(dict(GOOD, controls={"tau": "fast"})), "'tau' = 'fast' is not a non-negative number"),
    (json.dumps({"format": files.REFERENCE_FORMAT, "frac": [0.1, 0.2]}), "the reference has no 'normalized_loss'"),
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
        files.load_reference(str(path))
    message = str(e.value)
    assert message.startswith(f"{path}: ") and "`celerity collapse reference`" in message and "\n" not in message


def test_surrogate_files_round_trip(tmp_path):
    frac_G = (np.arange(100) + 0.5) / 100
    eta_G, eta_end = surrogate.schedule_on_grid(frac_G, "d2z", 0.1)
    curves_CxG = np.stack([np.asarray(surrogate.surrogate_curve(frac_G, eta_G, eta_end, 0.05 * tau**-0.3, 2.0))
                           for tau in (0.05, 0.1)])
    fit = surrogate.fit_surrogate(curves_CxG, frac_G, np.tile(np.asarray(eta_G), (2, 1)), np.full(2, float(eta_end)),
                                  np.array([0.05, 0.1]), np.array([20.0, 20.0]), rounds=2)
    path = os.path.join(tmp_path, "surrogate.json")
    files.save_surrogate(fit, [{"curve": "c0", "tau": 0.05, "tpp": 20.0}, {"curve": "c1", "tau": 0.1, "tpp": 20.0}],
                         (0.2, 1.0), {}, path)
    assert files.load_surrogate(path) == fit.constants
    with open(path) as f:
        data = json.load(f)
    assert data["format"] == files.SURROGATE_FORMAT and [c["curve"] for c in data["curves"]] == ["c0", "c1"]
    assert data["fixed"] == {"eps1": surrogate.EPS1, "eps2": surrogate.EPS2, "m": surrogate.M}
    assert files.fit_range_notes(path, 0.07, 20.0) == []
    assert "tau = 0.2 is outside the fitted runs' range [0.05, 0.1]" in files.fit_range_notes(path, 0.2, 20.0)[0]
    with open(path, "w") as f:
        f.write('{"format": "something else"}')
    with pytest.raises(ConfigError, match="format .something else., expected"):
        files.load_surrogate(path)


def test_the_shipped_default_loads_with_its_provenance():
    assert files.surrogate_path("default") == files.default_surrogate_path()
    assert files.surrogate_path("my.json") == "my.json"
    constants = files.default_surrogate()
    with open(files.default_surrogate_path()) as f:
        data = json.load(f)
    assert data["format"] == files.SURROGATE_FORMAT and constants == files.load_surrogate(files.default_surrogate_path())
    prov = data["provenance"]
    assert {"created", "machine", "commit", "command", "grid", "mae_per_size"} <= set(prov)
    assert len(data["curves"]) >= 4 and all({"tau", "tpp", "mae"} <= set(c) for c in data["curves"])
    assert 0 < data["mae"] < 0.1 and len(set(c["tau"] for c in data["curves"])) > 1
    assert all(np.isfinite([constants.b_c, constants.b_e, constants.q_c, constants.q_e]))


def test_eval_curves_from_a_run_directory_events_and_a_csv_column(tmp_path):
    run = tmp_path / "run"
    os.makedirs(run)
    _write(run / "plan.json", json.dumps(PLAN))
    _write(run / "curve.csv", "step,tokens,frac,loss\n1,20000,0.01,3.0\n2,40000,0.02,2.9\n")
    with pytest.raises(ConfigError, match="has no eval.csv: the run recorded no eval loss; train it with "
                                          "TrainConfig.eval_every or eval_points"):
        files.load_curve(str(run), loss="eval")
    _write(run / "eval.csv", "step,tokens,frac,loss\n50,1000000,0.5,2.5\n100,2000000,1.0,2.2\n")
    curve = files.load_curve(str(run), loss="eval")
    assert curve.loss == "eval" and curve.source.endswith("eval.csv") and curve.finished
    np.testing.assert_allclose(curve.loss_T, [2.5, 2.2])
    assert files.load_curve(str(run)).loss == "train"

    events = tmp_path / "tb"
    writer = Writer(str(events))
    for step, train, held_out in [(1, 3.0, None), (2, 2.9, 2.8), (3, 2.7, None), (4, 2.6, 2.5)]:
        writer.add_scalar("train/loss", train, step)
        if held_out is not None:
            writer.add_scalar("eval/loss", held_out, step)
    writer.close()
    curve = files.load_curve(str(events), loss="eval")
    np.testing.assert_allclose(curve.step_T, [2, 4])
    np.testing.assert_allclose(curve.loss_T, [2.8, 2.5], rtol=1e-6)

    path = _csv(tmp_path / "both.csv", [1, 2, 3], ["3.0,", "2.9,2.7", "2.8,2.6"], header="step,loss,eval_loss")
    curve = files.load_curve(str(path), loss="eval")
    np.testing.assert_allclose(curve.step_T, [2, 3])
    np.testing.assert_allclose(curve.loss_T, [2.7, 2.6])
    with pytest.raises(ConfigError, match=r"lacks column\(s\) \['eval_loss'\]"):
        files.load_curve(_csv(tmp_path / "train_only.csv", [1, 2], [3.0, 2.9]), loss="eval")
    with pytest.raises(ConfigError, match=r"the loss curve 'test' is not one of \('train', 'eval'\)"):
        files.load_curve(str(path), loss="test")
