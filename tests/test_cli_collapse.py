import json
import os
import re

import jax
import numpy as np
import pytest

from celerity_jax import cli
from celerity_jax.collapse import files, predictor, surrogate
from celerity_jax.collapse.curves import bin_centers

STEPS = 1200
GRID = ["--bins", "200"]
SIZES = (1e5, 2e5, 4e5, 8e5)
TAUS = (0.1, 0.17, 0.3)


def _final(n: float) -> float:
    return 4.0 * (n / 1e5)**-0.1


def _write_run(path: str, n: float, seed: int, tau: float = 0.17, steps: int = STEPS) -> str:
    """A CSV curve of a drifting synthetic family, with its sidecar of controls."""
    b = 0.1 * (tau / 0.17)**-0.3 * (n / 1e5)**0.1
    _, loss_T = surrogate.sample_curve(jax.random.key(seed), STEPS, b, 1.0, _final(n), 0.01)
    with open(path, "w") as f:
        f.write("step,loss\n" + "".join(f"{s},{v!r}\n" for s, v in zip(range(1, steps + 1), np.asarray(loss_T).tolist())))
    with open(path[:-4] + ".json", "w") as f:
        json.dump({"n_params": n, "tpp": 20, "tau": tau, "schedule": "d2z", "warmup_frac": 0.1,
                   "total_steps": STEPS}, f)
    return path


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    d = tmp_path_factory.mktemp("family")
    runs = {(n, s): _write_run(str(d / f"n{i}_s{s}.csv"), n, 10 * i + s) for i, n in enumerate(SIZES) for s in (0, 1)}
    return d, runs


def _json(path: str):
    with open(path) as f:
        return json.load(f)


def _celerity(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["collapse", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _references(capsys, d, runs) -> list[str]:
    paths = []
    for n in SIZES[:3]:
        paths.append(str(d / f"ref_{int(n)}.json"))
        code, out, _ = _celerity(capsys, "reference", runs[(n, 0)], runs[(n, 1)], "--out", paths[-1], *GRID)
        assert code == 0 and "wrote" in out
    return paths


def test_reference_and_family_aware_predict(capsys, family):
    d, runs = family
    refs = _references(capsys, d, runs)
    data = _json(refs[0])
    assert data["controls"]["n_params"] == 1e5 and len(data["frac"]) == 200 and data["provenance"]["n_seeds"] == 2

    partial = _write_run(str(d / "partial.csv"), SIZES[3], 77, steps=STEPS * 2 // 5)
    predict = ("predict", "--reference", ",".join(refs), "--curve", partial, *GRID)
    code, out, _ = _celerity(capsys, *predict, "--method", "family")
    assert code == 0 and "predicted final loss" in out and "by the family method" in out and "single reference" in out
    assert "method family: as asked" in out
    # every reference was built from runs of 1,200 steps: each gets the short-run regime's warning
    assert out.count("warning: reference ") == 3 and out.count("1,200 steps (< 1,300): shorter than the regime") == 3
    code, out, _ = _celerity(capsys, *predict, "--method", "family", "--json")
    result = json.loads(out)
    assert result["method"] == "family" and result["observed_frac"] == pytest.approx(0.4)
    assert result["pred_final_loss"] == pytest.approx(_final(SIZES[3]), rel=0.01)
    lo, hi = result["interval_95"]
    assert lo < result["pred_final_loss"] < hi
    assert "single_reference" in result and len(result["warnings"]) == 3 and refs[0] in result["warnings"][0]

    code, out, _ = _celerity(capsys, *predict, "--json")  # --method auto: chosen from the references alone
    result = json.loads(out)
    choice = predictor.choose_method([files.load_reference(p) for p in refs], bin_centers(200), 0.4,
                                     (0.25, 0.5))
    assert (result["method"], result["method_reason"], result["method_scores"]) == (choice.method, choice.reason,
                                                                                   choice.scores)
    assert set(result["method_scores"]) == {"nearest", "family"} and "leave-one-size-out" in result["method_reason"]
    written = str(d / "prediction.json")
    code, out, _ = _celerity(capsys, *predict, "--json", written)
    assert code == 0 and f"wrote {written}" in out and "predicted final loss" in out and _json(written) == result
    assert f"method {choice.reason}" in out
    code, out, _ = _celerity(capsys, *predict, "--method", "nearest", "--json")
    assert json.loads(out)["method"] == "nearest" and "single_reference" not in json.loads(out)
    code, _, err = _celerity(capsys, *predict, "--method", "best")
    assert code == 2 and "prediction method 'best' is unknown; use one of auto, nearest, family, shrunk" in err


def test_compare_draws_and_reports_quality(capsys, family):
    d, runs = family
    fig = str(d / "fig.png")
    code, out, _ = _celerity(capsys, "compare", *runs.values(), "--out", fig, "--json", *GRID)
    table = json.loads(out)
    assert code == 0 and os.path.getsize(fig) > 10_000
    assert len(table["rows"]) == len(runs) and table["residuals_against"] == "family mean"
    assert 0 < table["quality"]["mean_abs_dev"] < table["quality"]["max_range"]
    assert 0 < table["quality"]["supercollapse"]["ratio"]

    refs = _references(capsys, d, runs)
    table_path = str(d / "table.json")
    code, out, _ = _celerity(capsys, "compare", runs[(SIZES[3], 0)], "--reference", ",".join(refs), "--out", fig,
                             "--json", table_path, *GRID)
    assert code == 0 and "residuals against the reference" in out and "alert at" in out
    assert f"wrote {table_path}" in out and _json(table_path)["residuals_against"] == "reference"


def test_fit_then_reference_from_the_surrogate(capsys, tmp_path):
    curves = [_write_run(str(tmp_path / f"t{i}.csv"), 1e5, 100 + i, tau=tau) for i, tau in enumerate(TAUS)]
    out_path = str(tmp_path / "surrogate.json")
    code, out, _ = _celerity(capsys, "fit", *curves, "--out", out_path, *GRID)
    fitted = _json(out_path)
    assert code == 0 and "overall MAE" in out and "held at 0" in out  # one TPP: q_e cannot be fitted
    assert fitted["mae"] < 0.01 and len(fitted["curves"]) == 3 and fitted["constants"]["q_e"] == 0.0
    assert fitted["constants"]["b_e"] == pytest.approx(-0.3, abs=0.1)
    ref_path = str(tmp_path / "sref.json")
    code, out, _ = _celerity(capsys, "reference", "--surrogate", out_path, "--tau", "0.17", "--tpp", "20",
                             "--schedule", "d2z", "--warmup-frac", "0.1", "--out", ref_path, *GRID)
    assert code == 0 and _json(ref_path)["provenance"]["kind"] == "surrogate"
    code, out, _ = _celerity(capsys, "reference", "--surrogate", out_path, "--tau", "0.17", "--tpp", "20",
                             "--schedule", "d2z", "--out", ref_path, *GRID)
    assert "outside" not in out
    grid = _json(files.default_surrogate_path())["provenance"]["grid"]
    tau, tpp = str(min(grid["taus"])), str(max(grid["tpps"]))
    code, out, _ = _celerity(capsys, "reference", "--surrogate", "default", "--tau", tau, "--tpp", tpp,
                             "--schedule", "d2z", "--warmup-frac", "0.1", "--out", ref_path, *GRID)
    assert code == 0 and _json(ref_path)["provenance"]["source"].endswith("default_surrogate.json")
    assert "outside" not in out
    code, out, _ = _celerity(capsys, "reference", "--surrogate", "default", "--tau", str(0.5 * float(tau)),
                             "--tpp", tpp, "--schedule", "d2z", "--out", ref_path, *GRID)
    assert code == 0 and "tau = " in out and "is outside the fitted runs' range" in out


def test_bad_input_names_the_file_and_overwrites_nothing(capsys, family, tmp_path):
    d, runs = family
    keep = str(tmp_path / "keep.json")
    with open(keep, "w") as f:
        f.write("precious")
    bad = str(tmp_path / "bad.csv")
    with open(bad, "w") as f:
        f.write("step,value\n1,2\n")
    code, _, err = _celerity(capsys, "reference", bad, "--out", keep)
    assert code == 2 and "bad.csv" in err and "lacks column" in err
    with open(bad, "w") as f:
        f.write("step,loss\n1,3\n2,nan\n")
    code, _, err = _celerity(capsys, "reference", bad, "--out", keep)
    assert code == 2 and "bad.csv" in err and "nan" in err
    mixed = [runs[(SIZES[0], 0)], _write_run(str(tmp_path / "other.csv"), SIZES[0], 5, tau=0.3)]
    code, _, err = _celerity(capsys, "reference", *mixed, "--out", keep, *GRID)
    assert code == 2 and "tau 0.3 vs 0.17" in err and "--force" in err
    assert open(keep).read() == "precious"

    refs = _references(capsys, d, runs)
    short = _write_run(str(tmp_path / "short.csv"), SIZES[3], 6, steps=STEPS // 5)
    code, _, err = _celerity(capsys, "predict", "--reference", refs[0], "--curve", short, *GRID)
    assert code == 2 and "short.csv" in err and "shorter than the alignment window" in err
    code, _, err = _celerity(capsys, "predict", "--reference", refs[0], "--curve", short, "--total-steps", "100")
    assert code == 2 and "short.csv" in err and "smaller than the curve" in err
    code, _, err = _celerity(capsys, "predict", "--reference", refs[0], "--curve", mixed[1], *GRID)
    assert code == 2 and "tau 0.17 vs 0.3" in err
    bare = str(tmp_path / "bare.csv")
    with open(bare, "w") as f:
        f.write("step,loss\n" + "".join(f"{s},{3 - s / 1000}\n" for s in range(1, 500)))
    code, _, err = _celerity(capsys, "predict", "--reference", refs[0], "--curve", bare)
    assert code == 2 and "pass --total-steps" in err


def test_bad_paths_and_files_are_one_line_without_traceback(capsys, family, tmp_path):
    _, runs = family
    good = runs[(SIZES[0], 0)]
    binary = tmp_path / "binary.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps({"format": "celerity-collapse-reference/1", "controls": [], "frac": [0.1, 0.2],
                                  "normalized_loss": [1.1, 1.0]}))
    cases = [
        (["predict", "--reference", str(binary), "--curve", good], f"{binary}: not a JSON text file"),
        (["predict", "--reference", str(listed), "--curve", good], "the controls are an array"),
        (["predict", "--reference", str(tmp_path / "no.json"), "--curve", good],
         "--reference .*no.json does not exist"),
        (["compare", good, "--reference", str(tmp_path), "--out", str(tmp_path / "f.png")], "is a folder, not a file"),
        (["predict", "--reference", str(listed), "--curve", str(tmp_path / "no.csv")],
         "--curve .*no.csv does not exist"),
        (["compare", str(binary), "--out", str(tmp_path / "f.png")], f"{binary}: not a text CSV"),
        (["fit", good, str(tmp_path / "gone"), "--out", str(tmp_path / "s.json")], "CURVE .*gone does not exist"),
        (["compare", good, "--out", str(tmp_path / "figure")], "--out .*figure: the figure format comes from"),
        (["reference", good, "--out", str(tmp_path)], "--out .* is a folder; give a file path"),
        (["reference", good, "--out", str(tmp_path / "no" / "r.json")], "is not an existing folder"),
        (["compare", good, "--out", str(tmp_path / "f.png"), "--json", str(tmp_path)], "--json .* is a folder"),
        (["predict", "--reference", str(listed), "--curve", good, "--json", good], "--json .* is one of the inputs"),
        (["reference", "--surrogate", str(binary), "--tau", "0.17", "--tpp", "20", "--schedule", "d2z", "--out",
          str(tmp_path / "r.json")], "not a JSON text file .*; give a file made by `celerity collapse fit`"),
    ]
    for argv, problem in cases:
        code, _, err = _celerity(capsys, *argv)
        assert code == 2 and len(err.splitlines()) == 1 and re.search(problem, err), (argv, err)
    assert sorted(os.listdir(tmp_path)) == ["binary.csv", "listed.json"]


def test_collapse_is_a_celerity_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["collapse", "--help"])
    out = capsys.readouterr().out
    assert all(c in out for c in ("reference", "predict", "compare", "fit"))
