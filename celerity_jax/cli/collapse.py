"""`celerity collapse {reference,predict,compare,fit}`: the collapse toolkit on curve files.

A CURVE is a run directory, a TensorBoard event directory or a CSV (see collapse/files.py and
collapse/README.md). Every input path is checked first, then every input is read and checked before
anything is written; outputs are written atomically. The library is imported inside each command.
"""

import dataclasses
import datetime
import math
import os
import sys

from celerity_jax.cli import options
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_input_file, check_output_file
from celerity_jax.rundir import LOSS_CSV


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser("collapse", help="normalized loss curves: reference, predict, compare, fit")
    sub = parser.add_subparsers(dest="collapse_command", required=True)

    def loss_option(p) -> None:
        p.add_argument("--loss-curve", choices=tuple(LOSS_CSV), default="train",
                       help="which loss of each CURVE: the training loss (curve.csv, train/loss) or the held-out "
                            "eval loss (eval.csv, eval/loss, an eval_loss column)")

    def grid_options(p, window: bool = False) -> None:
        p.add_argument("--bins", type=int, default=1000, help="t̂ bins of the curve grid")
        p.add_argument("--smooth-bins", type=int, default=11, help="odd width of the moving average, in bins")
        p.add_argument("--offset", type=float, default=0.0,
                       help="L0 of (L − L0)/(L_T − L0); 0 divides by the final loss (the paper)")
        if window:
            p.add_argument("--window", default="0.25,0.5", help="t̂ range 'lo,hi' of early-align")
        p.add_argument("--force", action="store_true", help="accept mismatched controls")

    p = sub.add_parser("reference", help="build a reference JSON from finished curves or the surrogate")
    p.add_argument("curves", nargs="*", metavar="CURVE")
    p.add_argument("--out", required=True)
    p.add_argument("--surrogate", help="surrogate JSON (from `collapse fit`) instead of curves; 'default' for "
                                       "the constants shipped with the package (fitted to tiny CPU runs)")
    p.add_argument("--tau", type=float)
    p.add_argument("--tpp", type=float)
    p.add_argument("--schedule")
    p.add_argument("--warmup-frac", type=float, default=0.0)
    p.add_argument("--wsd-decay-frac", type=float, help="the decay fraction of a wsd schedule (default 0.2)")
    p.add_argument("--n-params", type=float)
    grid_options(p)
    loss_option(p)
    p.set_defaults(func=cmd_reference)

    p = sub.add_parser("predict", help="predict the final loss of a partial curve by early-align")
    p.add_argument("--reference", required=True, help="REF.json[,REF2.json...]")
    p.add_argument("--curve", required=True, metavar="PARTIAL")
    p.add_argument("--total-steps", type=int, help="the run's total steps (else from plan.json/sidecar)")
    p.add_argument("--n-params", type=float, help="the run's N (else from plan.json/sidecar)")
    p.add_argument("--method", default="auto",
                   help="how the references make the run's reference: nearest (the size nearest in log N), family "
                        "(fitted in log N across sizes), shrunk (family with unresolved slopes shrunk; 3 sizes or "
                        "more), or auto (the one that predicts the references' own sizes best, nearest unless "
                        "another is better beyond the noise)")
    options.add_json_option(p, "the prediction")
    grid_options(p, window=True)
    loss_option(p)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("compare", help="plot normalized curves and residuals; print collapse quality")
    p.add_argument("curves", nargs="+", metavar="CURVE")
    p.add_argument("--reference", help="REF.json[,REF2.json...]; else residuals against the family mean")
    p.add_argument("--out", required=True, help="figure path (.png)")
    options.add_json_option(p, "the table")
    grid_options(p, window=True)
    loss_option(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("fit", help="fit the surrogate's constants to finished curves")
    p.add_argument("curves", nargs="+", metavar="CURVE")
    p.add_argument("--out", required=True)
    p.add_argument("--bins", type=int, default=1000)
    p.add_argument("--smooth-bins", type=int, default=11)
    loss_option(p)
    p.set_defaults(func=cmd_fit)


def _grid(args):
    from celerity_jax.collapse.config import CurveGrid
    return CurveGrid(n_bins=args.bins, smooth_bins=args.smooth_bins, offset=getattr(args, "offset", 0.0))


def _window(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--window {text!r}: give 'lo,hi', e.g. 0.25,0.5") from None
    if not 0.0 <= lo < hi <= 1.0:
        raise ConfigError(f"--window {text!r}: need 0 <= lo < hi <= 1")
    return lo, hi


def _check_out(path: str | None, inputs: list[str], flag: str = "--out") -> None:
    """An output path (None, or '-' for stdout, is none) that is not an input and can be written."""
    if path in (None, "-"):
        return
    if any(os.path.abspath(path) == os.path.abspath(i) for i in inputs):
        raise ConfigError(f"{flag} {path} is one of the inputs; choose another output path")
    check_output_file(path, flag)


def _check_figure_format(path: str) -> None:
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if os.path.splitext(path)[1][1:].lower() not in formats:
        raise ConfigError(f"--out {path}: the figure format comes from the file extension; end the path in one of "
                          f"{', '.join('.' + f for f in sorted(formats))} (e.g. .png)")


def _check_curves(paths: list[str], flag: str = "CURVE") -> None:
    from celerity_jax.collapse.files import check_curve_path
    for path in paths:
        check_curve_path(path, flag)


def _reference_paths(text: str | None) -> list[str]:
    """The files of --reference REF.json[,REF2.json...], checked to exist."""
    paths = [p for p in (text or "").split(",") if p]
    for path in paths:
        check_input_file(path, "--reference")
    return paths


def _provenance() -> dict:
    return {"kind": "fit", "command": " ".join(sys.argv),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def cmd_reference(args) -> int:
    from celerity_jax.collapse import files, reference
    from celerity_jax.collapse.controls import Controls
    grid = _grid(args)
    _check_out(args.out, args.curves + [args.surrogate or ""])
    _check_curves(args.curves)
    if args.surrogate:
        if args.curves:
            raise ConfigError("give either CURVEs or --surrogate, not both")
        controls = Controls(args.n_params, args.tpp, args.tau, args.schedule, args.warmup_frac,
                            args.wsd_decay_frac)
        path = files.surrogate_path(args.surrogate)
        check_input_file(path, "--surrogate")
        ref = reference.reference_from_surrogate(files.load_surrogate(path), controls, grid.n_bins, path)
        for note in files.fit_range_notes(path, controls.tau, controls.tpp):
            print(f"note: {note}")
    else:
        if not args.curves:
            raise ConfigError("give the finished CURVEs (seeds of one size) or --surrogate")
        runs = [files.load_curve(c, loss=args.loss_curve) for c in args.curves]
        ref = reference.reference_from_curves(runs, grid.n_bins, grid.smooth_bins, grid.offset, args.force)
    files.save_reference(ref, args.out)
    print(f"wrote {args.out}: {ref.provenance['kind']}, controls {ref.controls.to_dict()}")
    return 0


def _prediction(run, reference_G, cfg) -> dict:
    """The predictor's final loss of `run` aligned with `reference_G`, and the monitor's metrics now."""
    from celerity_jax.collapse import curves, monitor, predictor

    pred = predictor.predict(run, reference_G, window=cfg.align_window, offset=cfg.offset,
                             min_span=cfg.min_align_span)
    if pred is None:
        lo, hi = cfg.align_window
        raise ConfigError(f"{run.source}: the curve ends at t̂ = {float(run.frac_T[-1]):.3f}, shorter than the "
                          f"alignment window [{lo:g}, {hi:g}] needs (t̂ >= {lo + cfg.min_align_span:.3g}); "
                          "pass an earlier --window")
    state = dict(zip(("loss_sum", "count"), curves.bin_curve(run.frac_T, run.loss_T, cfg.n_bins)))
    metrics = {k: float(v) for k, v in monitor.monitor_metrics(state, reference_G, cfg).items()}
    return {"pred_final_loss": pred.final, "pred_final_loss_err": pred.err,
            "normalized_loss": metrics["collapse/normalized_loss"], "residual": metrics["collapse/residual"],
            "alert": bool(metrics["collapse/alert"])}


def cmd_predict(args) -> int:
    from celerity_jax.collapse import curves, files, predictor, reference
    from celerity_jax.collapse.config import replay_config

    window = _window(args.window)
    cfg = replay_config(_grid(args), window)
    paths = _reference_paths(args.reference)
    _check_curves([args.curve], "--curve")
    _check_out(args.json, paths + [args.curve], "--json")
    run = files.load_curve(args.curve, args.total_steps, loss=args.loss_curve)
    if run.total_from == "last step":
        raise ConfigError(f"{run.source}: the run's total steps are unknown (no plan.json, sidecar or frac "
                          "column); pass --total-steps")
    if args.n_params:
        run = dataclasses.replace(run, controls=dataclasses.replace(run.controls, n_params=args.n_params))
    refs, notes = reference.load_checked(paths, cfg, run.controls, run.source, args.force, run.loss)
    frac_G, n_params = curves.bin_centers(cfg.n_bins), run.controls.n_params
    choice = predictor.method_for(args.method, refs, frac_G, n_params, float(run.frac_T[-1]), window,
                                  offset=cfg.offset)
    result = _prediction(run, predictor.reference_for(refs, frac_G, n_params, choice.method), cfg)
    out = {"curve": run.source, "step": int(run.step_T[-1]), "total_steps": run.total_steps,
           "observed_frac": float(run.frac_T[-1]), "window": [window[0], min(window[1], float(run.frac_T[-1]))],
           "method": choice.method, "method_reason": choice.reason, "method_scores": choice.scores,
           "references": paths, "pred_final_loss": result["pred_final_loss"],
           "pred_final_loss_err": result["pred_final_loss_err"],
           "interval_95": [result["pred_final_loss"] - 1.96 * result["pred_final_loss_err"],
                           result["pred_final_loss"] + 1.96 * result["pred_final_loss_err"]],
           "normalized_loss_now": result["normalized_loss"], "residual_now": result["residual"],
           "alert_now": result["alert"], "notes": notes, "warnings": reference.regime_notes(refs)}
    if choice.method != "nearest" and n_params is not None:
        single = _prediction(run, predictor.reference_for(refs, frac_G, n_params, "nearest"), cfg)
        out["single_reference"] = {"reference": reference.nearest(refs, n_params).source,
                                   "pred_final_loss": single["pred_final_loss"],
                                   "pred_final_loss_err": single["pred_final_loss_err"]}
    if options.emit_json(args.json, out):
        return 0
    print(f"curve {run.source} ({run.loss} loss): step {out['step']} of {run.total_steps} "
          f"(t̂ = {out['observed_frac']:.3f})")
    print(f"aligned over t̂ in [{out['window'][0]:.3g}, {out['window'][1]:.3g}] by the {choice.method} method "
          f"({len(paths)} reference(s))")
    print(f"method {choice.reason}")
    lo95, hi95 = out["interval_95"]
    print(f"predicted final loss: {out['pred_final_loss']:.4f} ± {out['pred_final_loss_err']:.4f} (1σ, "
          f"residual noise only); 95% interval [{lo95:.4f}, {hi95:.4f}]")
    if "single_reference" in out:
        s = out["single_reference"]
        print(f"single reference ({s['reference']}): {s['pred_final_loss']:.4f} ± {s['pred_final_loss_err']:.4f}")
    print(f"now: normalized loss {out['normalized_loss_now']:.4f}, residual {out['residual_now']:+.4f}, "
          f"alert {'YES' if out['alert_now'] else 'no'}")
    for note in out["notes"]:
        print(f"note: {note}")
    for warning in out["warnings"]:
        print(f"warning: {warning}")
    return 0


def cmd_compare(args) -> int:
    from celerity_jax.collapse import compare, files

    window = _window(args.window)
    grid = _grid(args)
    _check_out(args.out, args.curves)
    _check_figure_format(args.out)
    references = _reference_paths(args.reference)
    _check_curves(args.curves)
    _check_out(args.json, args.curves + references + [args.out], "--json")
    runs = [files.load_curve(c, loss=args.loss_curve) for c in args.curves]
    fam = compare.compare_family(runs, grid.n_bins, grid.smooth_bins, grid.offset, references, window, args.force)
    compare.plot_families({"": fam}, args.out)
    table = {"rows": fam.rows, "residuals_against": fam.baseline, "quality": fam.quality,
             "quality_range": list(compare.QUALITY_RANGE), "figure": args.out, "notes": fam.notes}
    if options.emit_json(args.json, table):
        return 0
    print(f"{'curve':40s} {'N':>9s} {'final':>8s} {'MAE':>8s} {'max|r|':>8s} {'alert at':>8s}")
    for row in fam.rows:
        onset = row.get("alert_onset_frac")
        print(f"{row['curve'][-40:]:40s} {row.get('n_params', math.nan):9.3g} {row['final_loss']:8.4f} "
              f"{row['mae']:8.4f} {row['max_abs_residual']:8.4f} {'-' if onset is None else f'{onset:.3f}':>8s}")
    print(f"{args.loss_curve} loss curves; residuals against the {fam.baseline}, over t̂ in [0.2, 1]")
    print("collapse quality: " + ", ".join(f"{k} {v:.4f}" for k, v in fam.quality.items() if k != "supercollapse"))
    if "supercollapse" in fam.quality:
        s = fam.quality["supercollapse"]
        print(f"supercollapse (Qiu et al.): spread across sizes Δ {s['delta']:.4f} vs seed noise σ "
              f"{s['sigma']:.4f} (Δ/σ {s['ratio']:.2f}; Δ < σ on {100 * s['frac_below']:.0f}% of t̂)")
    for note in fam.notes:
        print(f"note: {note}")
    print(f"wrote {args.out}")
    return 0


def cmd_fit(args) -> int:
    from celerity_jax.collapse import files, surrogate

    grid = _grid(args)
    _check_out(args.out, args.curves)
    _check_curves(args.curves)
    runs = [files.load_curve(c, loss=args.loss_curve) for c in args.curves]
    inputs = surrogate.surrogate_inputs(runs, grid.n_bins, grid.smooth_bins)
    info, tau_C, tpp_C = inputs.info, inputs.tau_C, inputs.tpp_C
    fit = surrogate.fit_surrogate(*inputs.arrays())
    files.save_surrogate(fit, info, (0.2, 1.0), _provenance(), args.out)
    k = fit.constants
    print(f"b = {k.b_c:.4g}·τ^{k.b_e:.3f}   q = {k.q_c:.4g}·TPP^{k.q_e:.3f}")
    for row, mae in zip(info, fit.mae_C):
        print(f"  {row['curve'][-50:]:50s} τ {row['tau']:.3g} TPP {row['tpp']:.3g}  MAE {100 * mae:.2f}%")
    print(f"overall MAE over t̂ in [0.2, 1]: {100 * fit.mae:.2f}%   wrote {args.out}")
    if len(set(tau_C)) < 2 or len(set(tpp_C)) < 2:
        print("note: one τ or one TPP value cannot identify its exponent; it was held at 0")
    return 0
