"""The collapse figure that the trainer writes to TensorBoard, as PNG bytes (matplotlib's Agg backend, no pyplot).

Above: the run's normalized curve so far (as the in-loop monitor aligns it) over its reference; below: their
residual (%); the title gives t̂ and the predicted final loss ± its error.
"""

import io
import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FIRST_FRAC = 0.1  # t̂ shown from here: before it the normalized loss is far above 1 and would squash the axes


def collapse_figure(frac_G: np.ndarray, normalized_G: np.ndarray, reference_G: np.ndarray, frac: float,
                    pred_final_loss: float, pred_final_loss_err: float) -> bytes:
    """The figure at t̂ = `frac` as PNG bytes: `normalized_G` (NaN where the run has no aligned curve yet) and
    `reference_G`, both on the bins at `frac_G`, with the predicted final loss ± its error (NaN: none yet)."""
    shown_G = np.asarray(frac_G) >= FIRST_FRAC
    frac_G, normalized_G, reference_G = (np.asarray(x, np.float64)[shown_G]
                                         for x in (frac_G, normalized_G, reference_G))
    fig = Figure(figsize=(6.4, 4.8), dpi=100)
    canvas = FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.1, top=0.93, hspace=0.08)  # tight_layout costs as much again
    top.plot(frac_G, reference_G, "k--", lw=1.2, label="reference")
    top.plot(frac_G, normalized_G, lw=1.4, label="run ÷ predicted final loss")
    top.set_ylabel("normalized loss")
    top.legend(fontsize=8, loc="upper right")
    if math.isfinite(pred_final_loss):
        top.set_title(f"t̂ = {frac:.2f}   predicted final loss {pred_final_loss:.4f} ± {pred_final_loss_err:.4f}",
                      fontsize=10)
    else:
        top.set_title(f"t̂ = {frac:.2f}   no prediction yet (early-align needs more of its window)", fontsize=10)
    bottom.axhline(0.0, color="k", lw=0.8)
    bottom.plot(frac_G, 100 * (normalized_G - reference_G), lw=1.0)
    bottom.set_xlim(FIRST_FRAC, 1.0)
    bottom.set_xlabel("fraction of training t̂")
    bottom.set_ylabel("residual (%)")
    png = io.BytesIO()
    canvas.print_png(png)
    return png.getvalue()
