"""Which controls the surrogate's b and q need: held-out MAE of power-law mappings on the grid of run.py.

    python experiments/surrogate/forms.py [--loss-curve eval] [run.py's grid and curve options]

The paper's mapping is b = b_c·τ^b_e and q = q_c·TPP^q_e. Each form here multiplies b and/or q by further
power laws in N (parameters), B (sequences per batch), the number of steps or (for q) τ, fits every constant
by Nelder-Mead on the mean MAE over t̂ ∈ [0.2, 1] (started from `surrogate.fit_surrogate`'s paper-form fit), and
scores it as run.py does: in-sample, with each size held out, and with each (τ, TPP) held out; a form whose
added control is constant on the grid is skipped. Needs the finished runs of run.py (the same grid, curve and
bins options); prints a table and writes forms.json beside run.py's results (results/, or results/train/ for
--loss-curve train).
"""

import json
import os
import sys

import numpy as np
from scipy.optimize import minimize

from celerity_jax.collapse import files, surrogate
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic
from run import FIT_RANGE, grid_runs, parse_args  # run.py beside this file: its grid and options

# form -> (the controls b depends on, the controls q depends on), each as a power law
FORMS = {
    "paper: b(τ), q(TPP)": (("tau",), ("tpp",)),
    "b(τ, N), q(TPP)": (("tau", "n_params"), ("tpp",)),
    "b(τ), q(TPP, N)": (("tau",), ("tpp", "n_params")),
    "b(τ, N), q(TPP, N)": (("tau", "n_params"), ("tpp", "n_params")),
    "b(τ), q(TPP, steps)": (("tau",), ("tpp", "steps")),
    "b(τ), q(TPP, τ)": (("tau",), ("tpp", "tau")),
    "b(τ, B), q(TPP, B)": (("tau", "batch_seqs"), ("tpp", "batch_seqs")),
}


class Grid:
    """The finished runs on the fit range: normalized curves, schedules and log-controls per run."""

    def __init__(self, args):
        names = [r.name for r in grid_runs(args)]
        runs = [files.load_curve(os.path.join(args.workdir, n), loss=args.loss_curve) for n in names]
        inputs = surrogate.surrogate_inputs(runs, args.bins, args.smooth_bins)
        keep_G = (inputs.frac_G >= FIT_RANGE[0]) & (inputs.frac_G <= FIT_RANGE[1])
        self.frac_G, self.curves_CxG = inputs.frac_G[keep_G], inputs.curves_CxG[:, keep_G]
        self.eta_CxG, self.eta_end_C = inputs.eta_CxG[:, keep_G], inputs.eta_end_C
        self.inputs = inputs
        plans = []
        for name in names:
            with open(os.path.join(args.workdir, name, "plan.json")) as f:
                plans.append(json.load(f))
        self.size_C = np.array([r.size for r in grid_runs(args)])
        controls = {"tau": inputs.tau_C, "tpp": inputs.tpp_C, **{k: np.array([p[k] for p in plans], float)
                                                                    for k in ("n_params", "batch_seqs", "steps")}}
        self.log_controls = {k: np.log(v / np.exp(np.mean(np.log(v)))) for k, v in controls.items()}  # centred

    def mae_C(self, theta: np.ndarray, form, index: np.ndarray) -> np.ndarray:
        b_vars, q_vars = form
        x = {k: v[index] for k, v in self.log_controls.items()}
        b_C = np.exp(theta[0] + sum(theta[1 + k] * x[v] for k, v in enumerate(b_vars)))
        q0 = 1 + len(b_vars)
        q_C = np.exp(theta[q0] + sum(theta[q0 + 1 + k] * x[v] for k, v in enumerate(q_vars)))
        pred_CxG = np.asarray(surrogate.surrogate_curve(self.frac_G[None, :], self.eta_CxG[index],
                                                        self.eta_end_C[index, None], b_C[:, None], q_C[:, None]))
        return np.mean(np.abs(pred_CxG - self.curves_CxG[index]), axis=1)

    def fit(self, form, index: np.ndarray) -> np.ndarray:
        paper = surrogate.fit_surrogate(*self.inputs.take(index).arrays(), *FIT_RANGE).constants
        # the paper-form constants, re-expressed for the centred controls, then zeros for the added terms
        tau0 = np.exp(np.mean(np.log(self.inputs.tau_C)))
        tpp0 = np.exp(np.mean(np.log(self.inputs.tpp_C)))
        theta = np.concatenate([[np.log(paper.b(tau0)), paper.b_e], np.zeros(len(form[0]) - 1),
                                [np.log(paper.q(tpp0)), paper.q_e], np.zeros(len(form[1]) - 1)])
        for _ in range(2):  # a restart from the first optimum
            theta = minimize(lambda t: self.mae_C(t, form, index).mean(), theta, method="Nelder-Mead",
                             options={"maxiter": 4000, "xatol": 1e-5, "fatol": 1e-7}).x
        return theta


def score(grid: Grid, form) -> dict:
    every = np.arange(len(grid.size_C))
    out = {"in_sample": float(grid.mae_C(grid.fit(form, every), form, every).mean())}
    size_held_out, cell_held_out = [], []
    for size in sorted(set(grid.size_C)):
        test = grid.size_C == size
        size_held_out += list(grid.mae_C(grid.fit(form, every[~test]), form, every[test]))
    for cell in sorted(set(zip(grid.inputs.tau_C, grid.inputs.tpp_C))):
        test = (grid.inputs.tau_C == cell[0]) & (grid.inputs.tpp_C == cell[1])
        cell_held_out += list(grid.mae_C(grid.fit(form, every[~test]), form, every[test]))
    out.update(size_held_out=float(np.mean(size_held_out)), cell_held_out=float(np.mean(cell_held_out)))
    return out


def main() -> int:
    args = parse_args(sys.argv[1:])
    try:
        grid = Grid(args)
    except ConfigError as e:
        raise SystemExit(f"forms.py: {e}; train the grid first: python experiments/surrogate/run.py with the same "
                         "--grid, --sizes, --taus and --tpps")
    rows = {}
    print(f"{args.loss_curve}-loss curves of {len(grid.size_C)} runs; MAE over t̂ in {list(FIT_RANGE)}")
    print(f"{'form':22s} {'in-sample':>10s} {'size held out':>14s} {'(τ, TPP) held out':>18s}")
    for name, form in FORMS.items():
        constant = [v for v in set(form[0] + form[1]) if np.ptp(grid.log_controls[v]) == 0]
        if constant:  # its added term is a constant factor, the paper form again
            print(f"{name:22s} not scored: {', '.join(constant)} constant on this grid")
            continue
        rows[name] = score(grid, form)
        r = rows[name]
        print(f"{name:22s} {100 * r['in_sample']:9.2f}% {100 * r['size_held_out']:13.2f}% "
              f"{100 * r['cell_held_out']:17.2f}%", flush=True)
    out = os.path.join(args.out, "forms.json")
    write_json_atomic(out, {"loss_curve": args.loss_curve, "bins": args.bins, "smooth_bins": args.smooth_bins,
                            "fit_range": list(FIT_RANGE), "forms": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
