"""Comparing finished curves: normalized curves, residuals, collapse quality, and their figure.

Residuals are taken against references (family-aware at each run's N, with the alert the in-loop
monitor would have raised) or, without references, against the family's mean curve.
"""

import dataclasses
import os
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from celerity_jax.collapse import curves, monitor
from celerity_jax.collapse.config import CurveGrid, replay_config
from celerity_jax.collapse.types import Curve
from celerity_jax.collapse.reference import reference_on_grid
from celerity_jax.fileio import save_figure_atomic
from celerity_jax.rundir import LOSS_CSV

QUALITY_RANGE = (0.2, 1.0)


@dataclasses.dataclass(frozen=True)
class FamilyComparison:
    frac_G: np.ndarray
    normalized_KxG: np.ndarray
    residual_KxG: np.ndarray
    baseline_G: np.ndarray   # the reference (mean over the runs' N) or the family mean
    baseline: str            # "reference" or "family mean"
    rows: list[dict]         # per run: curve, controls, final_loss, mae, max_abs_residual[, alert_onset_frac]
    quality: dict            # curves.collapse_quality, plus "supercollapse" when a size has several seeds
    notes: list[str]


def compare_family(runs: list[Curve], n_bins: int = 1000, smooth_bins: int = 11, offset: float = 0.0,
                   references: Sequence[str] = (), window: tuple[float, float] = (0.25, 0.5),
                   force: bool = False) -> FamilyComparison:
    """Normalizes finished runs on one grid and measures how well they collapse (t̂ in [0.2, 1]).

    With `references`, each run's alert onset is the monitor replayed with the default alert policy, aligned
    over `window` (config.replay_config).
    """
    cfg = replay_config(CurveGrid(n_bins, smooth_bins, offset), window)
    frac_G = curves.bin_centers(n_bins)
    normalized, finals = zip(*(curves.normalize_run(run, n_bins, smooth_bins, offset) for run in runs))
    normalized_KxG = np.stack(normalized)
    rows = [{"curve": r.source, **r.controls.to_dict(), "final_loss": f} for r, f in zip(runs, finals)]
    notes = []
    if references:
        baselines = []
        for run, row in zip(runs, rows):
            ref_G, run_notes = reference_on_grid(references, cfg, run.controls, run.source, force, run.loss)
            notes += run_notes
            baselines.append(np.asarray(ref_G))
            logs = monitor.replay_monitor(run.frac_T, run.loss_T, ref_G, cfg, max(1, run.total_steps // n_bins))
            alert_L = np.asarray(logs["collapse/alert"]) > 0
            row["alert_onset_frac"] = float(np.asarray(logs["frac"])[alert_L.argmax()]) if alert_L.any() else None
        baseline_KxG, baseline = np.stack(baselines), "reference"
    else:
        baseline_KxG, baseline = np.broadcast_to(normalized_KxG.mean(axis=0), normalized_KxG.shape), "family mean"
    residual_KxG = normalized_KxG - baseline_KxG
    keep_G = (frac_G >= QUALITY_RANGE[0]) & (frac_G <= QUALITY_RANGE[1])
    for row, r_G in zip(rows, residual_KxG):
        row["mae"] = float(np.abs(r_G[keep_G]).mean())
        row["max_abs_residual"] = float(np.abs(r_G[keep_G]).max())
    quality = {k: float(v) for k, v in curves.collapse_quality(normalized_KxG, frac_G, *QUALITY_RANGE).items()}
    groups: dict = {}
    for run, l_G in zip(runs, normalized_KxG):
        groups.setdefault(run.controls.n_params or run.name, []).append(l_G)
    seeds = max(len(g) for g in groups.values())
    if len(groups) > 1 and seeds > 1:
        curves_KxRxG = np.full((len(groups), seeds, n_bins), np.nan)
        for k, g in enumerate(groups.values()):
            curves_KxRxG[k, :len(g)] = g
        quality["supercollapse"] = {k: float(v) for k, v in curves.supercollapse(
            jnp.asarray(curves_KxRxG), frac_G, *QUALITY_RANGE).items()}
    return FamilyComparison(frac_G, normalized_KxG, residual_KxG, baseline_KxG.mean(axis=0), baseline, rows,
                            quality, notes)


def _label(source: str) -> str:
    """The run's name: its directory for a run directory's loss file, else the file or directory itself."""
    in_run_dir = os.path.basename(source) in LOSS_CSV.values()
    return os.path.basename(os.path.dirname(source) if in_run_dir else source)


def plot_families(families: dict[str, FamilyComparison], path: str) -> None:
    """One column per family: normalized curves above, residuals (%) below; written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(families), figsize=(6 * len(families), 7), sharex=True, sharey="row",
                             height_ratios=(2, 1), squeeze=False)
    for (title, fam), top, bottom in zip(families.items(), axes[0], axes[1]):
        for row, l_G, r_G in zip(fam.rows, fam.normalized_KxG, fam.residual_KxG):
            line, = top.plot(fam.frac_G, l_G, lw=1.2, label=_label(row["curve"]))
            bottom.plot(fam.frac_G, 100 * r_G, lw=1.0, color=line.get_color())
        if fam.baseline == "reference":
            top.plot(fam.frac_G, fam.baseline_G, "k--", lw=1.2, label="reference")
        top.set_title(title)
        top.legend(fontsize=8)
        bottom.axhline(0.0, color="k", lw=0.8)
        bottom.set_xlabel("fraction of training t̂")
        bottom.set_ylabel(f"residual vs {fam.baseline} (%)")
    late_G = [fam.normalized_KxG[:, fam.frac_G >= 0.1] for fam in families.values()]
    axes[0, 0].set_ylim(0.98 * min(x.min() for x in late_G), 1.02 * max(x.max() for x in late_G))
    axes[0, 0].set_ylabel("normalized loss L(t̂)/L(T)")
    axes[1, 0].set_xlim(0.1, 1.0)
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=120)
    plt.close(fig)
