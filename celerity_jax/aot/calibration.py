"""XLA's TPU step-time estimate, calibrated against published measurements.

`tpu_calibration.json` (beside this file) lists published training runs on Cloud TPU with their sources;
`experiments/tpu_calibration/calibrate.py` compiles each in this project's model at the same shape and slice and
writes, per run, the ratio r = measured tokens/s ÷ estimated tokens/s, and the fit: one ratio per chip (the
geometric mean of that chip's runs), since the ratio varies between chips far more than within one.

The calibrated expectation of a step is the estimate × its chip's r; its band spans the largest residual of any
run from its chip's ratio, either way. A chip with no published run gets no expectation. docs/accelerators.md
says how far to trust it.
"""

import functools
import json
import math
import os

from celerity_jax.errors import ConfigError

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tpu_calibration.json")
MIN_POINTS = 2  # a fit's band is the spread of its runs, which one run does not have


@functools.cache
def load(path: str = PATH) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"TPU calibration data {path!r} cannot be read ({e}); restore it from the repository") from None


def fit(points: list[dict]) -> dict:
    """One ratio per chip over `points` (each with "chip" and "ratio"): the geometric mean of the chip's ratios,
    the residuals of log r about it, and each point's leave-one-out error (from the other runs of its chip,
    where it has any)."""
    if len(points) < MIN_POINTS:
        raise ConfigError(f"a calibration fit needs at least {MIN_POINTS} points, got {len(points)}")
    logs: dict[str, list[float]] = {}
    for p in points:
        logs.setdefault(p["chip"], []).append(math.log(p["ratio"]))
    mean = {chip: sum(v) / len(v) for chip, v in logs.items()}
    residuals = [math.log(p["ratio"]) - mean[p["chip"]] for p in points]
    loo = [(sum(v) - x) / (len(v) - 1) - x for v in logs.values() if len(v) > 1 for x in v]
    return {"ratio_by_chip": {chip: math.exp(m) for chip, m in sorted(mean.items())},
            "runs_by_chip": {chip: len(v) for chip, v in sorted(logs.items())}, "n": len(points),
            "max_abs_log_residual": max(abs(r) for r in residuals),
            "rms_log_residual": math.sqrt(sum(r * r for r in residuals) / len(residuals)),
            "rms_log_loo": math.sqrt(sum(r * r for r in loo) / len(loo)) if loo else None,
            "est_mfu_range": [min(p["est_mfu"] for p in points), max(p["est_mfu"] for p in points)]}


def ratio(chip: str, f: dict) -> float | None:
    """The fitted measured ÷ estimated ratio of a chip, or None when no published run calibrates it."""
    return f["ratio_by_chip"].get(chip)


def expected(report: dict, data: dict | None = None) -> dict | None:
    """The calibrated expectation of a compile report's estimate, or None when the report has no TPU estimate,
    the data holds no fit or no run calibrates its chip: ratio, its band (lo, hi), step seconds, tokens/s and MFU
    (each with its band), and the basis it rests on, in words."""
    data = load() if data is None else data
    f = data.get("fit")
    if not f or not report.get("est_step_seconds") or not report.get("est_mfu"):
        return None
    r = ratio(report.get("chip", ""), f)
    if r is None:
        return None
    band = math.exp(f["max_abs_log_residual"])
    lo, hi = r / band, r * band
    lo_mfu, hi_mfu = f["est_mfu_range"]
    inside = lo_mfu <= report["est_mfu"] <= hi_mfu
    runs = f["runs_by_chip"][report["chip"]]
    basis = (f"XLA's estimate × {r:.2f}, measured ÷ estimated of the {runs} published "
             f"{report['chip']} run{'s' if runs > 1 else ''} (of {f['n']} on {', '.join(f['ratio_by_chip'])})"
             + ("" if inside else f"; est. MFU {report['est_mfu']:.0%} lies outside the calibrated "
                f"{lo_mfu:.0%}–{hi_mfu:.0%}"))
    return {"ratio": r, "ratio_lo": lo, "ratio_hi": hi,
            "step_seconds": report["est_step_seconds"] / r,
            "step_seconds_lo": report["est_step_seconds"] / hi, "step_seconds_hi": report["est_step_seconds"] / lo,
            "tokens_per_sec": report["est_tokens_per_sec"] * r, "mfu": report["est_mfu"] * r,
            "mfu_lo": report["est_mfu"] * lo, "mfu_hi": report["est_mfu"] * hi,
            "extrapolated": not inside, "basis": basis}
