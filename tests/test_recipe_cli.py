import json
import pathlib

import pytest

from celerity_jax import cli, gin_config
from celerity_jax.model import presets

REPO = pathlib.Path(__file__).resolve().parent.parent
CELERITY_DIR = REPO / "experiments" / "celerity"
# SCIENCE.md §7: batch in sequences, tokens at 20 / 80 / 234 TPP.
CELERITY = {"300m": (176, (5.4e9, 21.7e9, 63.4e9)), "500m": (240, (10.1e9, 40.2e9, 117.8e9)),
            "900m": (336, (18.1e9, 72.5e9, 212.3e9)), "1.8b": (464, (36.2e9, 144.8e9, 424.0e9)),
            "3.9b": (672, (77.6e9, 310.4e9, 909.2e9))}


TINY = ["--preset", "tiny-d32", "--gin_param", "RecipeConfig.seq_len = 64"]


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


@pytest.mark.parametrize("size", CELERITY)
def test_celerity_gin_files_match_presets_and_paper(size):
    batch, tokens = CELERITY[size]
    for tpp, band_tokens in zip((20, 80, 234), tokens):
        configs = gin_config.parse_gin([str(CELERITY_DIR / f"{size}_{tpp}tpp.gin")])
        assert configs["model"] == presets.preset(f"celerity-{size}")
        assert configs["recipe"].tpp == tpp and configs["recipe"].batch_seqs == batch


def test_plan_json_of_a_gin_file(capsys):
    assert cli.main(["plan", "--gin_file", str(CELERITY_DIR / "300m_80tpp.gin"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["tokens"] == pytest.approx(21.7e9, rel=0.01)
    assert plan["batch_seqs"] == 176 and plan["warmup_steps"] == round(375e6 / (176 * 8192))
    assert plan["tau"] == pytest.approx(0.087, rel=0.02)


def test_plan_text_with_preset_and_bindings(capsys):
    assert cli.main(["plan", *TINY, "--gin_param", "RecipeConfig.batch_seqs = 8",
                     "--gin_param", "RecipeConfig.tau = 0.3"]) == 0
    out = capsys.readouterr().out
    assert "8 seqs × 64 = 512 tokens" in out and "0.3 = B/(η_hidden·λ·D)" in out


def test_plan_json_file_is_written_whole_and_kept_on_error(tmp_path, capsys):
    path = tmp_path / "plan.json"
    args = ["plan", *TINY, "--json", str(path)]
    assert cli.main(args) == 0
    first = path.read_text()
    assert json.loads(first)["seq_len"] == 64
    assert cli.main(args + ["--gin_param", "RecipeConfig.tau = -1"]) == 2
    assert "RecipeConfig.tau = -1" in capsys.readouterr().err
    assert path.read_text() == first and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_ema_plot(tmp_path):
    png = tmp_path / "ema.png"
    assert cli.main(["plan", *TINY, "--ema_plot", str(png), "--json", str(tmp_path / "p.json")]) == 0
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
