"""Loss-curve collapse: normalize, reference, residual, predict, fit; offline and in the training loop.

Modules: `curves` (the shared jnp math), `family` (size-drift-aware reference), `surrogate` (the paper's
curve model and its fit), `loading` (curve files and controls), `reference` (reference JSON), `compare`
(quality tables and figures of finished runs), `monitor` (the in-loop monitor), `detectors` (a raw-loss
z-score detector, the baseline the alert is measured against), `commands` (`celerity collapse ...`).
See README.md beside this file.
"""
