"""`celerity demo`: the paper's mechanism in three panels against seed noise; writes demo.png, report.md and
report.json. The library is `celerity_jax/demo.py` (runs) and `celerity_jax/demo_report.py` (measures)."""

import os

from celerity_jax.cli import options
from celerity_jax.demo import DEFAULT, FULL  # demo.py's top imports are light


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("demo", help="train the demo's runs (three panels: τ, TPP, a family under the τ and "
                                           "naive recipes); write demo.png, report.md and report.json")
    options.add_workdir_options(p, default="runs/demo", workdir_help="the demo's directory: a run directory per "
                                                                     "run, demo.png, report.md and report.json; "
                                                                     "with --full runs/demo-full")
    # Not required, and resolved by the form in demo_command: --full's family runs are not the default form's.
    p.set_defaults(workdir=None)
    form = p.add_mutually_exclusive_group()
    form.add_argument("--quick", action="store_true", help="panels 1 and 2 only (about 5 minutes here)")
    form.add_argument("--full", action="store_true",
                      help=f"the family over {','.join(FULL.sizes)} with {FULL.tau_seeds} seeds per size under the τ "
                           f"recipe and {FULL.naive_seeds} under the naive one, scored downstream (about 30 minutes here)")
    p.add_argument("--sizes", default=None,
                   help="comma-separated experiments/demo/sizes/<size>.gin names for the family, smallest first "
                        f"(default {','.join(DEFAULT.sizes)}, with --full {','.join(FULL.sizes)})")
    options.add_gin_options(p, required=False, file_help="gin file layered on every run after the demo's own "
                                                         "(a variant of the whole demo)")
    p.set_defaults(func=demo_command)


def demo_command(args) -> int:
    from celerity_jax import demo

    design = demo.QUICK if args.quick else demo.FULL if args.full else demo.DEFAULT
    sizes = None if args.sizes is None else tuple(s for s in args.sizes.split(",") if s)
    workdir = args.workdir or ("runs/demo-full" if args.full else "runs/demo")
    report = demo.run_demo(workdir, design, sizes, force_new=args.force_new,
                           gin_files=tuple(args.gin_file), gin_params=tuple(args.gin_param))
    print()
    if "timescale" in report:
        p = report["timescale"]
        print(f"1. equal τ: Δ/σ {p['delta_over_sigma']:.2f}; off-τ "
              + ", ".join(f"{k} {v:.1f}σ" for k, v in p["off"].items()) + _met(p["met"]))
    if "tpp" in report:
        p = report["tpp"]
        print("2. TPP ×½, ×1, ×2: adjacent curves " + ", ".join(f"{k} {v:.1f}σ" for k, v in p["pairs"].items())
              + _met(p["met"]))
    if "family" in report:
        tau, naive = report["family"]["tau"], report["family"]["naive"]
        print(f"3. τ family {tau['sizes'][0]}–{tau['sizes'][-1]}: trend {tau['trend']:+.1f} SE, Δ/σ "
              f"{tau['delta_over_sigma']:.2f} (floor {tau['floor']:.2f})" + _met(report["family"]["met"])
              + f"; naive family: trend {naive['trend']:+.1f} SE, Δ/σ {naive['delta_over_sigma']:.2f}")
    if report["regime"]["outside"]:
        print(f"outside the short-run regime: {', '.join(report['regime']['outside'])}")
    print(f"wrote {os.path.join(workdir, 'report.md')}, report.json and demo.png")
    return 0


def _met(met: bool) -> str:
    return "  (targets met)" if met else "  (targets NOT met)"
