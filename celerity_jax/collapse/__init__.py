"""Loss-curve collapse: normalize, reference, residual, predict, fit; offline and in the training loop.

Modules, each importing only those above it:
- `controls`: `Controls` (TPP, τ, schedule, N of a curve), read from plans and JSON, and how two are compared.
- `types`: the values passed around: a loss `Curve` and a `Reference`.
- `regime`: the short-run regime's thresholds in steps and tokens, and the warning line of a run below them.
- `curves`: the curve math on a t̂ grid (binning, smoothing, normalization, early-align, residuals, the
  family-aware curve, collapse quality), pure jnp; plus `normalize_run`, the loss EMA `loss_ema` and a family's
  measures against seed noise (`family_measures`: trend with N, Δ/σ and its floor, the paper's MAE).
- `surrogate`: the paper's curve model, its fit, and the runs prepared for it.
- `files`: what is read and written: curve files (`load_curve`), reference JSON and surrogate JSON (with the
  shipped default).
- `config`: `CurveGrid` (the offline tools' grid) and `MonitorConfig` (gin-bound; the alert policy).
- `reference`: building references (from curves or the surrogate) and choosing them for a run
  (`check_controls`, `load_checked`, `reference_on_grid`, `nearest`), and the warning line of a
  reference outside the short-run regime (`regime_notes`).
- `predictor`: the one home of final-loss prediction (a run's curve so far, its references by the nearest, family
  or shrunk method, the window), and the choice of method by leave-one-size-out on the references
  (`choose_method`, `method_for`; `choose_method_across` for a sweep's settings together): the monitor,
  `celerity collapse predict`, the sweep and the benchmark call it.
- `monitor`: the in-loop monitor's jitted state and metrics, and its replay on a recorded curve.
- `compare`: quality tables and figures of finished runs.
- `detectors`: a raw-loss z-score detector, the baseline the alert is measured against.
- `image`: the collapse figure the trainer writes to TensorBoard.
The command line is `celerity_jax/cli/collapse.py` (`celerity collapse ...`). See README.md beside this file.
"""
