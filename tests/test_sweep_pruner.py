import math

import pytest

optuna = pytest.importorskip("optuna")

from celerity_jax.collapse.predictor import Prediction  # noqa: E402
from celerity_jax.errors import ConfigError  # noqa: E402
from celerity_jax.sweep.pruner import CollapsePruner, report  # noqa: E402

FINALS = {0.2: 3.0, 0.4: 2.8, 0.8: 3.3}   # the true final loss of each setting
STEPS = 100


def _objective(err: float, bias: float = 0.0):
    """A trial predicts its final loss (plus `bias`) with 1σ error `err` at 10%, 20%, ... of training."""
    def objective(trial):
        final = FINALS[trial.suggest_categorical("tau", list(FINALS))]
        for step in range(10, STEPS + 1, 10):
            report(trial, Prediction(final + bias, err, step / STEPS, (step / 2 / STEPS, step / STEPS)), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return final
    return objective


def _study(pruner, order=(0.4, 0.2, 0.8)):
    """A study whose trials take the settings in `order`."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=pruner)
    for tau in order:
        study.enqueue_trial({"tau": tau})
    return study


def _states(study) -> dict[float, str]:
    return {t.params["tau"]: t.state.name for t in study.trials}


def test_a_trial_that_cannot_beat_the_best_stops_at_the_first_fraction_allowed():
    study = _study(CollapsePruner(min_frac=0.2, k=2.0))
    study.optimize(_objective(err=0.01), n_trials=3)
    assert _states(study) == {0.4: "COMPLETE", 0.2: "PRUNED", 0.8: "PRUNED"}
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert all(t.last_step == 20 for t in pruned)  # not at 10%: below min_frac
    assert all(t.intermediate_values[20] == FINALS[t.params["tau"]] for t in pruned)  # visible to Optuna's tools
    assert study.best_value == 2.8


def test_a_prediction_whose_error_reaches_the_best_is_not_pruned():
    study = _study(CollapsePruner(min_frac=0.1, k=2.0))
    study.optimize(_objective(err=0.15), n_trials=3)  # 3.0 − 2·0.15 < 2.8, but 3.3 − 0.3 > 2.8
    assert _states(study) == {0.4: "COMPLETE", 0.2: "COMPLETE", 0.8: "PRUNED"}


def test_the_margin_covers_a_mismatch():
    study = _study(CollapsePruner(min_frac=0.1, k=0.0, margin=0.1))  # prune above 2.8·1.1 = 3.08
    study.optimize(_objective(err=0.0), n_trials=3)
    assert _states(study) == {0.4: "COMPLETE", 0.2: "COMPLETE", 0.8: "PRUNED"}


def test_nothing_is_pruned_before_a_trial_finishes():
    # the worst first: nothing to compare with, so it runs to the end; then each beats the one before
    study = _study(CollapsePruner(min_frac=0.0), (0.8, 0.2, 0.4))
    study.optimize(_objective(err=0.0), n_trials=3)
    assert _states(study) == {0.8: "COMPLETE", 0.2: "COMPLETE", 0.4: "COMPLETE"}
    assert math.isclose(study.trials[0].user_attrs["collapse_seen_frac/100"], 1.0)


def test_bad_settings_get_one_line():
    with pytest.raises(ConfigError, match="need 0 <= min_frac <= 1"):
        CollapsePruner(min_frac=1.5)
    study = optuna.create_study(direction="maximize", pruner=CollapsePruner())
    with pytest.raises(ConfigError, match="maximizes; the collapse pruner needs a minimized final loss"):
        study.optimize(_objective(err=0.0), n_trials=1, catch=())
