def test_demo_refuses_an_unknown_size_in_one_line(tmp_path, capsys):
    from celerity_jax.cli import main

    assert main(["demo", "--workdir", str(tmp_path / "demo"), "--sizes", "d40-l2,d999"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "d999" in err and "experiments/demo/sizes" in err
    assert not (tmp_path / "demo").exists()


def test_quick_and_full_exclude_each_other(tmp_path, capsys):
    import pytest

    from celerity_jax.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["demo", "--workdir", str(tmp_path / "demo"), "--quick", "--full"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_quick_with_sizes_and_a_size_named_twice_get_one_line(tmp_path, capsys):
    from celerity_jax.cli import main

    for extra, problem in ((["--quick", "--sizes", "d40-l2,d48-l2"], "--quick trains no family"),
                           (["--sizes", "d40-l2,d40-l2"], "a size twice")):
        assert main(["demo", "--workdir", str(tmp_path / "demo"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and problem in err
    assert not (tmp_path / "demo").exists()


def test_a_variant_too_short_for_the_report_grid_is_refused_before_anything_trains(tmp_path, capsys):
    from celerity_jax.cli import main

    assert main(["demo", "--workdir", str(tmp_path / "demo"), "--quick", "--gin-param", "RecipeConfig.tpp = 0.2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bins of t̂ empty" in err and "RecipeConfig.tpp" in err
    assert "--bins" not in err
    assert not (tmp_path / "demo").exists()
