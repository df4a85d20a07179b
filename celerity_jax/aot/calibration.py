"""XLA's TPU step-time estimate, calibrated against published measurements.

`tpu_calibration.json` (beside this file) lists published training runs on Cloud TPU with their sources;
`experiments/tpu_calibration/calibrate.py` compiles each in this project's model at the same shape and slice and
writes, per run, the ratio r = measured tokens/s ÷ estimated tokens/s, and a fit of r against the estimated MFU:

    r = a · est_MFU^b        (least squares in log r; b = 0 is one factor, b = −1 a fixed measured MFU)

The calibrated expectation of a step is the estimate × r; its band spans the fit's largest residuals either
way. docs/accelerators.md says how far to trust it.
"""

import functools
import json
import math
import os

from celerity_jax.errors import ConfigError

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tpu_calibration.json")


@functools.cache
def load(path: str = PATH) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"TPU calibration data {path!r} cannot be read ({e}); restore it from the repository") from None


def fit(points: list[dict]) -> dict:
    """The least-squares fit of log r = log a + b·log est_MFU over `points` (each with "ratio" and "est_mfu"), its
    residuals, and the leave-one-out error of each point."""
    if len(points) < 3:
        raise ConfigError(f"a calibration fit needs at least 3 points, got {len(points)}")
    x = [math.log(p["est_mfu"]) for p in points]
    y = [math.log(p["ratio"]) for p in points]
    log_a, b = _line(x, y)
    residuals = [yi - (log_a + b * xi) for xi, yi in zip(x, y)]
    loo = []
    for i in range(len(points)):
        la, bb = _line(x[:i] + x[i + 1:], y[:i] + y[i + 1:])
        loo.append(y[i] - (la + bb * x[i]))
    return {"a": math.exp(log_a), "b": b, "n": len(points),
            "residual_min": min(residuals), "residual_max": max(residuals),
            "rms_log_residual": math.sqrt(sum(r * r for r in residuals) / len(residuals)),
            "rms_log_loo": math.sqrt(sum(r * r for r in loo) / len(loo)),
            "est_mfu_range": [min(p["est_mfu"] for p in points), max(p["est_mfu"] for p in points)]}


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    n, mx, my = len(x), sum(x) / len(x), sum(y) / len(y)
    sxx = sum((xi - mx) ** 2 for xi in x)
    if n < 2 or sxx == 0:
        return my, 0.0
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sxx
    return my - b * mx, b


def ratio(est_mfu: float, f: dict) -> float:
    """The fitted measured ÷ estimated ratio at an estimated MFU."""
    if not est_mfu > 0:
        raise ConfigError(f"an estimated MFU of {est_mfu!r} cannot be calibrated; it must be > 0")
    return f["a"] * est_mfu ** f["b"]


def expected(report: dict, data: dict | None = None) -> dict | None:
    """The calibrated expectation of a compile report's estimate, or None when the report has no TPU estimate (or
    the data holds no fit): ratio, its band (lo, hi), step seconds, tokens/s and MFU (each with its band), and
    the basis it rests on, in words."""
    data = load() if data is None else data
    f = data.get("fit")
    if not f or not report.get("est_step_seconds") or not report.get("est_mfu"):
        return None
    r = ratio(report["est_mfu"], f)
    lo, hi = r * math.exp(f["residual_min"]), r * math.exp(f["residual_max"])
    lo_mfu, hi_mfu = f["est_mfu_range"]
    inside = lo_mfu <= report["est_mfu"] <= hi_mfu
    chips = sorted({p["chip"] for p in data.get("points", [])})
    basis = (f"XLA's estimate × {r:.2f}: measured ÷ estimated of {f['n']} published runs "
             f"({', '.join(chips)}), fitted as {f['a']:.2f}·est_MFU^{f['b']:.2f}"
             + ("" if inside else f"; est. MFU {report['est_mfu']:.0%} lies outside the calibrated "
                f"{lo_mfu:.0%}–{hi_mfu:.0%}, so this extrapolates"))
    return {"ratio": r, "ratio_lo": lo, "ratio_hi": hi,
            "step_seconds": report["est_step_seconds"] / r,
            "step_seconds_lo": report["est_step_seconds"] / hi, "step_seconds_hi": report["est_step_seconds"] / lo,
            "tokens_per_sec": report["est_tokens_per_sec"] * r, "mfu": report["est_mfu"] * r,
            "mfu_lo": report["est_mfu"] * lo, "mfu_hi": report["est_mfu"] * hi,
            "extrapolated": not inside, "basis": basis}
