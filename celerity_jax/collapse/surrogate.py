"""The paper's surrogate of the normalized curve (SCIENCE.md §5) and its alternating grid-search fit.

l̂(t̂) = ((1+ε1)/(t̂+ε1))^m + b·(η(t̂)+ε2)^q, divided by its value at t̂ = 1; η is the schedule with
peak 1; ε1 = 0.001, ε2 = 0.1, m = 0.05 fixed; b = b_c·τ^b_e, q = q_c·TPP^q_e. The four constants are
fitted by mean absolute error over t̂ ∈ [0.2, 1]: a grid over (b_c, b_e) with q fixed, then over
(q_c, q_e) with b fixed, repeated while the grids zoom in on the best point.
"""

import dataclasses
import functools
import importlib.resources

import jax
import jax.numpy as jnp
import numpy as np

from celerity_jax import schedules
from celerity_jax.collapse.loading import read_json
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic

FORMAT = "celerity-collapse-surrogate/1"
# `--surrogate default` names the constants shipped with the package (fitted by experiments/surrogate/).
DEFAULT = "default"
DEFAULT_FILE = "default_surrogate.json"
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
                     wsd_decay_frac: float = 0.2) -> tuple[jax.Array, jax.Array]:
    """(η on the grid, η(1)) of a named schedule (celerity_jax.schedules) with peak 1."""
    return (schedules.normalized(schedule, frac_G, warmup_frac, wsd_decay_frac),
            schedules.normalized(schedule, 1.0, warmup_frac, wsd_decay_frac))


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


def save_surrogate(fit: SurrogateFit, curve_info: list[dict], fit_range: tuple[float, float],
                   provenance: dict, path: str) -> None:
    """Writes the fitted constants, the MAE per curve (with `curve_info`) and overall."""
    write_json_atomic(path, {
        "format": FORMAT, "constants": dataclasses.asdict(fit.constants),
        "fixed": {"eps1": EPS1, "eps2": EPS2, "m": M}, "fit_range": list(fit_range), "mae": fit.mae,
        "curves": [dict(info, mae=float(m)) for info, m in zip(curve_info, fit.mae_C)],
        "provenance": provenance})


def load_surrogate(path: str) -> SurrogateConstants:
    data = read_json(path, FORMAT, "celerity collapse fit")
    try:
        return SurrogateConstants(**{k: float(data["constants"][k]) for k in ("b_c", "b_e", "q_c", "q_e")})
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: malformed surrogate constants ({e!r}); refit it") from e


def fit_range_notes(path: str, tau: float, tpp: float) -> list[str]:
    """Notes when τ or TPP lie outside the values of the curves the surrogate in `path` was fitted on."""
    fitted = read_json(path, FORMAT, "celerity collapse fit").get("curves", [])
    notes = []
    for name, value in (("tau", tau), ("tpp", tpp)):
        values = [c[name] for c in fitted if isinstance(c, dict) and isinstance(c.get(name), int | float)]
        if values and not min(values) <= value <= max(values):
            notes.append(f"{name} = {value:g} is outside the fitted runs' range [{min(values):g}, {max(values):g}] "
                         f"of {path}; the surrogate extrapolates")
    return notes


def default_surrogate_path() -> str:
    """The surrogate file shipped with the package (see its "provenance")."""
    return str(importlib.resources.files("celerity_jax.collapse") / DEFAULT_FILE)


def surrogate_path(name: str) -> str:
    """`default` → the shipped file; anything else is a path."""
    return default_surrogate_path() if name == DEFAULT else name


def default_surrogate() -> SurrogateConstants:
    """The shipped constants, fitted to the project's tiny runs (not to LLM-scale runs)."""
    return load_surrogate(default_surrogate_path())
