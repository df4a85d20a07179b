"""`celerity demo`: the paper's mechanism in three panels against seed noise; writes demo.png, report.md and
report.json. The library is `celerity_jax/demo.py` (runs) and `celerity_jax/demo_report.py` (measures)."""

import os

from celerity_jax.cli import options
from celerity_jax.demo import SIZES  # demo.py's top imports are light


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("demo", help="train the demo's runs (three panels: τ, TPP, a family under the τ and "
                                           "naive recipes); write demo.png, report.md and report.json")
    options.add_workdir_options(p, default="runs/demo", workdir_help="the demo's directory: a run directory per "
                                                                     "run, demo.png, report.md and report.json")
    p.add_argument("--quick", action="store_true", help="panels 1 and 2 only (about 3 minutes)")
    p.add_argument("--sizes", default=",".join(SIZES), help="comma-separated experiments/demo/sizes/<size>.gin "
                                                            "names, smallest first")
    options.add_gin_options(p, required=False, file_help="gin file layered on every run after the demo's own "
                                                         "(a variant of the whole demo)")
    p.set_defaults(func=demo_command)


def demo_command(args) -> int:
    from celerity_jax import demo

    sizes = tuple(s for s in args.sizes.split(",") if s)
    report = demo.run_demo(args.workdir, sizes, quick=args.quick, force_new=args.force_new,
                           gin_files=tuple(args.gin_file), gin_params=tuple(args.gin_param))
    print()
    for panel, line in (("timescale", "1. equal τ: Δ/σ {delta_over_sigma:.2f}; off-τ {off_text}"),
                        ("tpp", "2. TPP ×½, ×1, ×2: adjacent curves {pairs_text}"),
                        ("family", "3. family: naive / τ spread {ratio:.2f}; τ family Δ/σ {delta_over_sigma:.2f}")):
        if panel in report:
            p = report[panel]
            print(line.format(**p, off_text=", ".join(f"{k} {v:.1f}σ" for k, v in p.get("off", {}).items()),
                              pairs_text=", ".join(f"{k} {v:.1f}σ" for k, v in p.get("pairs", {}).items()))
                  + ("  (targets met)" if p["met"] else "  (targets NOT met)"))
    print(f"wrote {os.path.join(args.workdir, 'report.md')}, report.json and demo.png")
    return 0
