import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.sweep import spec


def test_parse_sweep_names_settings_and_rejects_bad_input():
    param, settings = spec.parse_sweep("RecipeConfig.tau=0.2, 0.4")
    assert param == "RecipeConfig.tau"
    assert [(s.name, s.binding) for s in settings] == [("tau_0.2", "RecipeConfig.tau = 0.2"),
                                                       ("tau_0.4", "RecipeConfig.tau = 0.4")]
    assert spec.parse_sweep("RecipeConfig.schedule='d2z','wsd'")[1][1].name == "schedule_wsd"
    for bad in ("RecipeConfig.tau", "tau=0.2", "RecipeConfig.tau=", "RecipeConfig.tau=0.2,0.2"):
        with pytest.raises(ConfigError, match="--sweep"):
            spec.parse_sweep(bad)
    assert spec.parse_fractions("0.3,0.1") == (0.1, 0.3)
    with pytest.raises(ConfigError, match="fraction"):
        spec.parse_fractions("0.1,1.0")


def test_the_sweep_methods_are_auto_and_the_predictors():
    from celerity_jax.collapse import predictor

    assert spec.METHODS[0] == "auto" and sorted(spec.METHODS[1:]) == sorted(predictor.METHODS)
