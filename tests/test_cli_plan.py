import json
import pathlib

import pytest

from celerity_jax import cli

REPO = pathlib.Path(__file__).resolve().parent.parent
CELERITY_DIR = REPO / "experiments" / "celerity"
TINY = ["--preset", "tiny-d32", "--gin-param", "RecipeConfig.seq_len = 64"]


def _tau(lr: str) -> list[str]:
    return ["tau", "--batch-tokens", "4e6", "--lr", lr, "--wd", "0.1", "--tokens", "2e12"]


def test_tau_command_audits_llama2(capsys):
    assert cli.main(_tau("3e-4")) == 0
    assert "tau = 0.06667" in capsys.readouterr().out
    assert cli.main(_tau("1.5e-4")) == 0
    assert "tau = 0.1333" in capsys.readouterr().out


def test_tau_command_rejects_zero_lr(capsys):
    assert cli.main(_tau("0")) == 2
    assert "lr = 0.0 must be > 0" in capsys.readouterr().err


def test_plan_json_of_a_gin_file(capsys):
    assert cli.main(["plan", "--gin-file", str(CELERITY_DIR / "300m_80tpp.gin"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["tokens"] == pytest.approx(21.7e9, rel=0.01)
    assert plan["batch_seqs"] == 176 and plan["warmup_steps"] == round(375e6 / (176 * 8192))
    assert plan["tau"] == pytest.approx(0.087, rel=0.02)


def test_plan_accepts_gins_underscore_spelling(capsys):
    assert cli.main(["plan", "--gin_file", str(CELERITY_DIR / "300m_80tpp.gin"),
                     "--gin_param", "RecipeConfig.tpp = 20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tpp"] == 20


def test_plan_text_with_preset_and_bindings(capsys):
    assert cli.main(["plan", *TINY, "--gin-param", "RecipeConfig.batch_seqs = 8",
                     "--gin-param", "RecipeConfig.tau = 0.3"]) == 0
    out = capsys.readouterr().out
    assert "8 seqs × 64 = 512 tokens" in out and "0.3 = B/(η_hidden·λ·D)" in out


def test_plan_json_file_is_written_whole_and_kept_on_error(tmp_path, capsys):
    path = tmp_path / "plan.json"
    args = ["plan", *TINY, "--json", str(path)]
    assert cli.main(args) == 0
    first = path.read_text()
    assert json.loads(first)["seq_len"] == 64
    assert cli.main(args + ["--gin-param", "RecipeConfig.tau = -1"]) == 2
    assert "RecipeConfig.tau = -1" in capsys.readouterr().err
    assert path.read_text() == first and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_an_unwritable_json_path_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    for path, problem in ((tmp_path / "missing" / "plan.json", "is not an existing folder"),
                          (tmp_path, "is a folder"), (tmp_path / "a_file" / "plan.json", "is not an existing folder")):
        assert cli.main(["plan", *TINY, "--json", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"--json {path}" in err and problem in err


def test_ema_plot(tmp_path):
    png = tmp_path / "ema.png"
    assert cli.main(["plan", *TINY, "--ema-plot", str(png), "--json", str(tmp_path / "p.json")]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_table_is_generated_and_up_to_date(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "PLANS.md"
    assert cli.main(["plan-table", "--out", str(out)]) == 0
    table = out.read_text()
    assert table == (CELERITY_DIR / "PLANS.md").read_text(), "run `celerity plan-table` to refresh PLANS.md"
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows][:3] == ["300m_20tpp.gin", "300m_80tpp.gin", "300m_234tpp.gin"]
    assert len(rows) == 15
