"""Loss-curve collapse: normalize, reference, residual, predict, fit; offline and in the training loop.

Modules:
- `controls`: `Controls` (TPP, τ, schedule, N of a curve), read from plans and JSON, and the checks that a
  run and its references share them.
- `curves`: the curve math on a t̂ grid (binning, smoothing, normalization, early-align, residuals, the
  family-aware curve, collapse quality), pure jnp; plus `normalize_run` and the loss EMA `loss_ema`.
- `files`: what is read and written: curve files (`Curve`, `load_curve`), reference JSON (`Reference`) and
  surrogate JSON (with the shipped default).
- `reference`: building references (from curves or the surrogate) and choosing them for a run
  (`reference_on_grid`, `nearest`, `spans_sizes`).
- `surrogate`: the paper's curve model, its fit, and the runs prepared for it.
- `config`: `CurveGrid` (the offline tools' grid) and `MonitorConfig` (gin-bound; the alert policy).
- `monitor`: the in-loop monitor's jitted state and metrics, and its replay on a recorded curve.
- `compare`: quality tables and figures of finished runs.
- `detectors`: a raw-loss z-score detector, the baseline the alert is measured against.
The command line is `celerity_jax/cli/collapse.py` (`celerity collapse ...`). See README.md beside this file.
"""
