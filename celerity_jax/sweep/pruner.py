"""The paper's early stopping as an Optuna pruner: a trial stops when its predicted final loss, with its
error, cannot beat the best finished trial.

The objective reports, as training goes on, the collapse predictor's prediction (collapse/predictor.py) with
`report(trial, prediction, step)`: the predicted final loss becomes the trial's intermediate value at that step
(so Optuna's dashboard and tools show it), its 1σ error and the fraction of training seen are kept as the
trial's user attributes. `CollapsePruner` prunes a trial once it has seen `min_frac` of its training and
pred − k·err > best · (1 + margin), `best` the lowest value of the study's finished trials (a minimized final
loss); `margin` covers what the 1σ error leaves out, a mismatch between the run and its references.

    study = optuna.create_study(pruner=CollapsePruner(min_frac=0.2), storage=...)

Needs the `optuna` package (the `sweep` extra).
"""

import math

import optuna

from celerity_jax.collapse.predictor import Prediction
from celerity_jax.errors import ConfigError

ERR_ATTR = "collapse_pred_err"     # user attribute prefix: the 1σ error at a step
SEEN_ATTR = "collapse_seen_frac"   # user attribute prefix: the fraction of training seen at a step


def report(trial: optuna.Trial, prediction: Prediction, step: int) -> None:
    """Reports the predicted final loss as the trial's intermediate value at `step`, with its error and t̂."""
    trial.set_user_attr(f"{ERR_ATTR}/{step}", prediction.err)
    trial.set_user_attr(f"{SEEN_ATTR}/{step}", prediction.seen)
    trial.report(prediction.final, step)


class CollapsePruner(optuna.pruners.BasePruner):
    """Prunes a trial whose predicted final loss minus k·(its error) exceeds the best final loss by `margin`."""

    def __init__(self, min_frac: float = 0.1, k: float = 2.0, margin: float = 0.0):
        if not 0.0 <= min_frac <= 1.0 or k < 0.0 or margin < 0.0:
            raise ConfigError(f"CollapsePruner(min_frac={min_frac}, k={k}, margin={margin}): need 0 <= min_frac <= 1, "
                              "k >= 0 and margin >= 0")
        self.min_frac, self.k, self.margin = min_frac, k, margin

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if study.direction != optuna.study.StudyDirection.MINIMIZE:
            raise ConfigError(f"study {study.study_name!r} maximizes; the collapse pruner needs a minimized final "
                              "loss (optuna.create_study(direction='minimize'))")
        step = trial.last_step
        if step is None or trial.user_attrs.get(f"{SEEN_ATTR}/{step}", 0.0) < self.min_frac:
            return False
        finished = [t.value for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
        if not finished:
            return False
        pred, err = trial.intermediate_values[step], trial.user_attrs.get(f"{ERR_ATTR}/{step}", 0.0)
        if not math.isfinite(pred):
            return False
        return pred - self.k * err > min(finished) * (1.0 + self.margin)
