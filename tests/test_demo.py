import pytest

from celerity_jax import demo, gin_config, recipe
from celerity_jax.collapse import regime
from celerity_jax.errors import ConfigError


def _plans(runs):
    configs = {r.name: gin_config.parse_gin(r.gin_files, r.gin_params) for r in runs}
    return configs, {name: recipe.make_plan(c.model, c.recipe) for name, c in configs.items()}


@pytest.mark.parametrize("design, span, seeds", [(demo.DEFAULT, 1.8, 2), (demo.FULL, 4, 3)])
def test_the_family_pins_tau_under_one_recipe_and_fixes_tokens_lr_batch_and_decay_under_the_other(design, span,
                                                                                                   seeds):
    runs = demo.demo_runs(design)
    configs, plans = _plans(runs)
    tau = [plans[f"tau/{s}"] for s in design.sizes]
    naive = [plans[f"naive/{s}"] for s in design.sizes]
    assert len({p.tpp for p in tau}) == 1
    assert max(p.tau for p in tau) == pytest.approx(min(p.tau for p in tau))
    assert tau[-1].n_params / tau[0].n_params >= span
    assert min(configs[f"tau/{s}"].model.d_model for s in design.sizes) > 32  # above the d32 transition
    assert max(p.tokens for p in naive) / min(p.tokens for p in naive) < 1.01
    assert {p.weight_decay for p in naive} == {1.0}
    assert len({(p.base_lr, p.batch_seqs) for p in naive + tau}) == 1
    widths = [configs[f"naive/{s}"].model.d_model for s in design.sizes]
    assert naive[-1].tau / naive[0].tau == pytest.approx(widths[-1] / widths[0])  # one λ: τ grows with the width
    for s in design.sizes:  # every size has `seeds` τ runs (or more) and 2 naive ones (or more)
        assert len([r for r in runs if r.group == "tau" and r.label == s]) >= seeds
        assert len([r for r in runs if r.group == "naive" and r.label == s]) >= 2
    seeds_of = {r.name: configs[r.name].train.seed for r in runs}
    for r in runs:
        if r.group == "naive":
            assert seeds_of[r.name] == seeds_of[r.name.replace("naive/", "tau/")]  # a size's k-th seed is shared
    naive_runs = [r for r in runs if r.group == "naive"]
    assert len({seeds_of[r.name] for r in runs}) == len(runs) - len(naive_runs)  # else every run has its own
    assert {(c.train.eval_points, c.train.eval_batches * c.recipe.batch_seqs) for c in configs.values()} == {(50, 128)}


@pytest.mark.parametrize("design", [demo.QUICK, demo.DEFAULT, demo.FULL])
def test_every_run_of_the_demo_sits_in_the_short_run_regime(design):
    _, plans = _plans(demo.demo_runs(design))
    assert {name: regime.outside(p.steps, p.tokens) for name, p in plans.items()} == {name: None for name in plans}


def test_the_panels_vary_batch_lr_and_decay_at_equal_tau_then_tau_then_tpp_at_one_size():
    runs = demo.demo_runs()
    _, plans = _plans(runs)
    base = plans["timescale/base"]
    assert base.n_params == plans[f"tau/{demo.DEFAULT.sizes[0]}"].n_params
    assert base.tau == pytest.approx(recipe.tau_law(base.tpp))
    for name, (b, lr, t) in demo.TIMESCALE_SETTINGS.items():
        p = plans[f"timescale/{name}"]
        assert (p.batch_seqs, p.base_lr, p.tpp) == (base.batch_seqs * b, pytest.approx(base.base_lr * lr), base.tpp)
        assert p.tau == pytest.approx(base.tau * t)
        assert p.weight_decay == pytest.approx(base.weight_decay * b / lr / t, rel=1e-3)  # steps are whole
    equal = [(b, lr) for b, lr, t in demo.TIMESCALE_SETTINGS.values() if t == 1]
    assert len(equal) >= 3 and {t for *_, t in demo.TIMESCALE_SETTINGS.values()} == {1.0, 0.25, 4.0}
    assert sorted(round(plans[f"timescale/{n}"].weight_decay / base.weight_decay, 2) for n, (_, _, t) in
                  demo.TIMESCALE_SETTINGS.items() if t == 1) == [1, 2, 2]  # λ both moved and held
    for name, x in demo.TPP_SETTINGS.items():
        assert plans[f"tpp/{name}"].tpp == pytest.approx(base.tpp * x)
        assert plans[f"tpp/{name}"].tau == pytest.approx(base.tau)
    assert sorted(demo.TPP_SETTINGS.values()) == [0.5, 2.0]
    quick = demo.demo_runs(demo.QUICK)
    assert {r.group for r in quick} == {"timescale", "tpp"} and quick == [r for r in runs if r in quick]


@pytest.mark.parametrize("sizes, problem", [(("d40-l2", "d999"), "no size file"), (("d40-l2",), "at least two")])
def test_bad_sizes_get_one_line(sizes, problem):
    with pytest.raises(ConfigError, match=problem):
        demo.demo_runs(demo.DEFAULT, sizes)
