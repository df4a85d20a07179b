"""The two values the collapse toolkit passes around: a loss `Curve` (read by files.load_curve) and a `Reference`
(built by reference.py, stored by files.py)."""

import dataclasses

import numpy as np

from celerity_jax.collapse.controls import Controls


@dataclasses.dataclass(frozen=True)
class Curve:
    """A loss curve as read by `load_curve`: exact int64 steps, finite positive losses, t̂ = frac_T."""
    name: str
    source: str
    step_T: np.ndarray
    loss_T: np.ndarray
    frac_T: np.ndarray
    total_steps: int
    total_from: str  # "given", the plan/sidecar path, "frac column" or "last step" (assumed finished)
    controls: Controls
    loss: str = "train"  # which loss: "train" or "eval" (held-out)

    @property
    def finished(self) -> bool:
        return bool(self.step_T[-1] >= self.total_steps - 1)


@dataclasses.dataclass(frozen=True)
class Reference:
    """A normalized curve on a t̂ grid with its controls and provenance (see reference.py)."""
    frac_G: np.ndarray
    normalized_G: np.ndarray
    seed_std_G: np.ndarray | None   # across the seeds it averages; None for one seed or the surrogate
    controls: Controls
    offset: float                   # L0 of the normalization (L − L0)/(L_T − L0)
    final_loss: float | None        # mean final (smoothed) loss of its runs
    provenance: dict
    source: str = "built in memory"  # the file it was loaded from
