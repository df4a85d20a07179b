import pytest

from celerity_jax import cli


def test_coordcheck_command_draws_the_figure_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "coordcheck.png"
    argv = ["coordcheck", "--out", str(out), "--widths", "16", "--depths", "1", "--steps", "2",
            "--modes", "completep"]
    assert cli.main(argv) == 0
    assert out.stat().st_size > 0
    text = capsys.readouterr().out
    assert "completep width residual_rms" in text and "spread" in text


@pytest.mark.parametrize("flag, value", [("--widths", "64,100"), ("--modes", "ntk"), ("--depths", "x"),
                                         ("--out", "/nonexistent-dir/cc.png"), ("--experts", "0"),
                                         ("--router", "random"), ("--experts-per-token", "3")])
def test_coordcheck_bad_arguments_exit_2_before_any_work(flag, value, tmp_path, capsys):
    argv = ["coordcheck", "--out", str(tmp_path / "cc.png"), flag, value]
    assert cli.main(argv) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "cc.png").exists()
