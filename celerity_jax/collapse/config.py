"""The collapse configs: `CurveGrid` (the t̂ grid of the offline tools) and `MonitorConfig` (the in-loop
monitor, gin-bound; it holds the alert policy)."""

import dataclasses

from celerity_jax.config_types import check_field_types
from celerity_jax.errors import ConfigError
from celerity_jax.rundir import LOSS_CSV


def _grid_checks(n_bins: int, smooth_bins: int, offset: float) -> dict[str, tuple[bool, str]]:
    return {"n_bins": (n_bins >= 2, "n_bins must be >= 2"),
            "smooth_bins": (smooth_bins >= 1 and smooth_bins % 2 == 1 and smooth_bins < n_bins,
                            "smooth_bins must be odd, >= 1 and < n_bins"),
            "offset": (offset >= 0.0, "offset must be >= 0")}


def _raise_first_failure(config, checks) -> None:
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"{type(config).__name__}: {message} (got {config})")


@dataclasses.dataclass(frozen=True)
class CurveGrid:
    """How curves are put on a common t̂ grid: `n_bins` equal bins of t̂ = step/T, a centered moving average
    over `smooth_bins` (odd) bins, and the normalization (L − L0)/(L_T − L0) with L0 = `offset` (0: the
    paper's plain division by the final loss). Pick `n_bins` so that a bin holds several steps."""
    n_bins: int = 1000
    smooth_bins: int = 11
    offset: float = 0.0

    def __post_init__(self):
        check_field_types(self)
        _raise_first_failure(self, _grid_checks(self.n_bins, self.smooth_bins, self.offset).values())


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """The in-loop collapse monitor: its grid, its early-align window and its alert policy.

    Early-align predicts the final loss from the bins of `align_window` seen so far; every metric but the
    alert is NaN until the run has passed align_window[0] + `min_align_span`.

    Alert policy: at bin j the residual r_j = l_run − l_ref of the smoothed, normalized loss has noise
    σ_j = l_ref(t̂_j)·sqrt(σ²/n_j + δ²), with σ the per-step noise and δ the divisor's error that early-align
    measures on this run's own window, and n_j the steps in the smoothing window of bin j; σ_j is raised to
    `residual_floor` if smaller (a floor tolerates a known size drift of the family). `collapse/alert` is 1
    when |r_j| > `alert_k`·σ_j at each of the last `alert_m` bins up to the current one. A bin plays the role
    of one log (1/n_bins of training), so the policy does not depend on the logging interval: the defaults
    k = 4, m = 10 mean 1% of training with 1000 bins. `stop_on_alert` asks the trainer to stop (with a
    checkpoint) when the alert is raised.

    `loss_curve` is the curve the monitor follows: "train", the training loss of every step, or "eval", the
    held-out loss of each eval (TrainConfig.eval_points spreads evals evenly over t̂). An eval curve has one
    point per eval, so give it a grid of at most eval_points bins and an alert_m of a few bins (e.g.
    n_bins = eval_points = 50, smooth_bins = 1, alert_m = 3); its reference must be built from eval curves.

    The fields and their order are part of a run's identity (run.json); `grid` is the CurveGrid they give.
    """
    n_bins: int = 1000
    smooth_bins: int = 11               # odd; centered moving average over bins
    align_window: tuple[float, float] = (0.25, 0.5)  # t̂ range of early-align (the paper's 25–50%)
    min_align_span: float = 0.05        # predictions start at t̂ = align_window[0] + this
    offset: float = 0.0                 # L0 of (L − L0)/(L_T − L0); 0 = the paper's plain division
    alert_k: float = 4.0
    alert_m: int = 10
    residual_floor: float = 0.0         # least σ of the residual, in normalized-loss units
    stop_on_alert: bool = False         # read by the trainer: stop (with a checkpoint) on an alert
    loss_curve: str = "train"           # "train" or "eval"

    def __post_init__(self):
        check_field_types(self)  # also makes align_window a pair: a tuple, hashable when gin gives a list
        lo, hi = self.align_window
        grid = _grid_checks(self.n_bins, self.smooth_bins, self.offset)
        _raise_first_failure(self, [
            grid["n_bins"],
            grid["smooth_bins"],
            (0.0 <= lo < hi <= 1.0, "align_window must be (lo, hi) with 0 <= lo < hi <= 1"),
            (0.0 < self.min_align_span <= hi - lo, "min_align_span must be in (0, hi - lo]"),
            grid["offset"],
            (self.alert_k > 0.0, "alert_k must be > 0"),
            (self.alert_m >= 1, "alert_m must be >= 1"),
            (self.residual_floor >= 0.0, "residual_floor must be >= 0"),
            (self.loss_curve in LOSS_CSV, f"loss_curve must be one of {tuple(LOSS_CSV)}"),
        ])

    @property
    def grid(self) -> CurveGrid:
        return CurveGrid(self.n_bins, self.smooth_bins, self.offset)


def replay_config(grid: CurveGrid, window: tuple[float, float]) -> MonitorConfig:
    """The monitor as the offline tools replay it: the default alert policy on `grid`, aligned over `window`."""
    return MonitorConfig(n_bins=grid.n_bins, smooth_bins=grid.smooth_bins, offset=grid.offset, align_window=window,
                         min_align_span=min(MonitorConfig.min_align_span, window[1] - window[0]))
