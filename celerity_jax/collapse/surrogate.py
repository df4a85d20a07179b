"""The paper's surrogate of the normalized curve (docs/science.md §5), its alternating grid-search fit, and
the finished runs prepared for it (`surrogate_inputs`). Its JSON file is read and written by files.py.

l̂(t̂) = ((1+ε1)/(t̂+ε1))^m + b·(η(t̂)+ε2)^q, divided by its value at t̂ = 1; η is the schedule with
peak 1; ε1 = 0.001, ε2 = 0.1, m = 0.05 fixed; b = b_c·τ^b_e, q = q_c·TPP^q_e. The four constants are
fitted by mean absolute error over t̂ ∈ [0.2, 1]: a grid over (b_c, b_e) with q fixed, then over
(q_c, q_e) with b fixed, repeated while the grids zoom in on the best point.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax import schedules
from celerity_jax.collapse import curves
from celerity_jax.collapse.types import Curve
from celerity_jax.errors import ConfigError

EPS1 = 0.001
EPS2 = 0.1
M = 0.05


@dataclasses.dataclass(frozen=True)
class SurrogateConstants:
    b_c: float
    b_e: float
    q_c: float
    q_e: float

    def b(self, tau: float) -> float:
        return self.b_c * tau**self.b_e

    def q(self, tpp: float) -> float:
        return self.q_c * tpp**self.q_e


@jax.jit
def surrogate_curve(frac_G: jax.Array, eta_G: jax.Array, eta_end: jax.Array, b: jax.Array,
                    q: jax.Array) -> jax.Array:
    """l̂ at t̂ = `frac_G` with schedule values `eta_G` there and `eta_end` = η(1)."""
    def raw(frac, eta):
        return ((1.0 + EPS1) / (frac + EPS1))**M + b * (eta + EPS2)**q
    return raw(frac_G, eta_G) / raw(1.0, eta_end)


def schedule_on_grid(frac_G: jax.Array, schedule: str, warmup_frac: float,
                     wsd_decay_frac: float | None = None) -> tuple[jax.Array, jax.Array]:
    """(η on the grid, η(1)) of a named schedule (celerity_jax.schedules) with peak 1; a wsd decay fraction of
    None is the schedules' default."""
    shape = {} if wsd_decay_frac is None else {"wsd_decay_frac": wsd_decay_frac}
    return (schedules.normalized(schedule, frac_G, warmup_frac, **shape),
            schedules.normalized(schedule, 1.0, warmup_frac, **shape))


@dataclasses.dataclass(frozen=True)
class SurrogateFit:
    constants: SurrogateConstants
    mae_C: np.ndarray   # MAE of each curve over the fit range
    mae: float          # their mean


@jax.jit
def _mae_per_curve(curves_CxG, frac_G, eta_CxG, eta_end_C, b_QxC, q_QxC):
    """MAE of every curve under each of Q candidate (b, q) per curve: [Q, C]."""
    def one(bq):
        b_C, q_C = bq
        pred_CxG = surrogate_curve(frac_G[None, :], eta_CxG, eta_end_C[:, None], b_C[:, None], q_C[:, None])
        return jnp.mean(jnp.abs(pred_CxG - curves_CxG), axis=1)
    return jax.lax.map(one, (b_QxC, q_QxC))


def _in_range(curves_CxG, frac_G, eta_CxG, eta_end_C, lo: float, hi: float) -> tuple[jax.Array, ...]:
    keep_G = (np.asarray(frac_G) >= lo) & (np.asarray(frac_G) <= hi)
    return (jnp.asarray(np.asarray(curves_CxG)[:, keep_G], jnp.float32),
            jnp.asarray(np.asarray(frac_G)[keep_G], jnp.float32),
            jnp.asarray(np.asarray(eta_CxG)[:, keep_G], jnp.float32), jnp.asarray(eta_end_C, jnp.float32))


def mae_per_curve(constants: SurrogateConstants, curves_CxG: np.ndarray, frac_G: np.ndarray,
                  eta_CxG: np.ndarray, eta_end_C: np.ndarray, tau_C: np.ndarray, tpp_C: np.ndarray,
                  lo: float = 0.2, hi: float = 1.0) -> np.ndarray:
    """MAE over t̂ ∈ [lo, hi] of each curve under the given constants (e.g. on curves not fitted)."""
    b_C = np.array([constants.b(t) for t in np.asarray(tau_C, float)])
    q_C = np.array([constants.q(p) for p in np.asarray(tpp_C, float)])
    return np.asarray(_mae_per_curve(*_in_range(curves_CxG, frac_G, eta_CxG, eta_end_C, lo, hi),
                                     jnp.asarray(b_C[None], jnp.float32), jnp.asarray(q_C[None], jnp.float32)))[0]


def fit_surrogate(curves_CxG: np.ndarray, frac_G: np.ndarray, eta_CxG: np.ndarray, eta_end_C: np.ndarray,
                  tau_C: np.ndarray, tpp_C: np.ndarray, lo: float = 0.2, hi: float = 1.0,
                  grid: int = 21, rounds: int = 12, zoom: float = 0.7) -> SurrogateFit:
    """Fits (b_c, b_e, q_c, q_e) to C normalized curves on a shared t̂ grid by alternating grid search.

    Each round searches a grid×grid grid of (log b_c, b_e) with q fixed, then of (log q_c, q_e) with b
    fixed, each centred on the best point so far; the grids' half-widths shrink by `zoom` per round.
    An exponent is held at 0 when all curves share its control (one τ or one TPP cannot identify it).
    """
    data = _in_range(curves_CxG, frac_G, eta_CxG, eta_end_C, lo, hi)
    log_tau_C, log_tpp_C = np.log(np.asarray(tau_C, float)), np.log(np.asarray(tpp_C, float))

    def mae_QxC(theta_Qx4: np.ndarray) -> np.ndarray:
        b_QxC = np.exp(theta_Qx4[:, :1] + theta_Qx4[:, 1:2] * log_tau_C)
        q_QxC = np.exp(theta_Qx4[:, 2:3] + theta_Qx4[:, 3:4] * log_tpp_C)
        return np.asarray(_mae_per_curve(*data, jnp.asarray(b_QxC, jnp.float32),
                                         jnp.asarray(q_QxC, jnp.float32)))

    # theta = (log b_c, b_e, log q_c, q_e): start and half-widths of the search
    theta = np.array([np.log(0.1), 0.0, 0.0, 0.0])
    half = np.array([np.log(100.0), 1.5 * (np.ptp(log_tau_C) > 1e-6), np.log(20.0),
                     1.5 * (np.ptp(log_tpp_C) > 1e-6)])
    unit = np.linspace(-1.0, 1.0, grid)
    for _ in range(rounds):
        for i in (0, 2):  # the b pair, then the q pair
            a, e = np.meshgrid(theta[i] + half[i] * unit, theta[i + 1] + half[i + 1] * unit, indexing="ij")
            candidates = np.tile(theta, (a.size, 1))
            candidates[:, i], candidates[:, i + 1] = a.ravel(), e.ravel()
            theta = candidates[np.argmin(mae_QxC(candidates).mean(axis=1))]
        half *= zoom
    mae_C = mae_QxC(theta[None])[0]
    constants = SurrogateConstants(float(np.exp(theta[0])), float(theta[1]), float(np.exp(theta[2])),
                                   float(theta[3]))
    return SurrogateFit(constants, mae_C, float(mae_C.mean()))


@functools.partial(jax.jit, static_argnames=("steps", "schedule", "warmup_frac"))
def sample_curve(key: jax.Array, steps: int, b: float, q: float, final_loss: float, noise: float,
                 schedule: str = "d2z", warmup_frac: float = 0.1) -> tuple[jax.Array, jax.Array]:
    """A synthetic run whose normalized curve is the surrogate: (frac_T, loss_T) at t̂ = step/T.

    loss = final_loss·l̂(t̂)·(1 + noise·ε), ε standard normal per step. For tests and benchmarks.
    """
    frac_T = jnp.arange(1, steps + 1, dtype=jnp.float32) / steps
    eta_T, eta_end = schedule_on_grid(frac_T, schedule, warmup_frac)
    clean_T = final_loss * surrogate_curve(frac_T, eta_T, eta_end, b, q)
    return frac_T, clean_T * (1.0 + noise * jax.random.normal(key, (steps,)))


@dataclasses.dataclass(frozen=True)
class SurrogateInputs:
    """Finished runs prepared for the surrogate: normalized curves and schedules on one t̂ grid."""
    curves_CxG: np.ndarray
    frac_G: np.ndarray
    eta_CxG: np.ndarray
    eta_end_C: np.ndarray
    tau_C: np.ndarray
    tpp_C: np.ndarray
    info: list[dict]   # per curve: its source and controls

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The positional arguments of fit_surrogate (after the constants, of mae_per_curve)."""
        return self.curves_CxG, self.frac_G, self.eta_CxG, self.eta_end_C, self.tau_C, self.tpp_C

    def take(self, index) -> "SurrogateInputs":
        """The curves at `index` (an index array or boolean mask)."""
        index = np.arange(len(self.info))[index]
        return SurrogateInputs(self.curves_CxG[index], self.frac_G, self.eta_CxG[index], self.eta_end_C[index],
                               self.tau_C[index], self.tpp_C[index], [self.info[i] for i in index])


def surrogate_inputs(runs: list[Curve], n_bins: int, smooth_bins: int) -> SurrogateInputs:
    """Normalizes finished runs and evaluates their schedules on the grid; ConfigError if a control is missing."""
    frac_G = curves.bin_centers(n_bins)
    curves_C, eta_C, eta_end_C = [], [], []
    for run in runs:
        c = run.controls
        missing = [n for n in ("tau", "tpp", "schedule") if getattr(c, n) is None]
        if missing:
            raise ConfigError(f"{run.source}: the surrogate needs the controls {missing}; add them to the "
                              "sidecar JSON or use a run directory")
        curves_C.append(curves.normalize_run(run, n_bins, smooth_bins)[0])
        eta_G, eta_end = schedule_on_grid(frac_G, c.schedule, c.warmup_frac or 0.0, c.wsd_decay_frac)
        eta_C.append(np.asarray(eta_G))
        eta_end_C.append(float(eta_end))
    return SurrogateInputs(np.stack(curves_C), np.asarray(frac_G), np.stack(eta_C), np.array(eta_end_C),
                           np.array([r.controls.tau for r in runs]), np.array([r.controls.tpp for r in runs]),
                           [{"curve": r.source, **r.controls.to_dict()} for r in runs])
