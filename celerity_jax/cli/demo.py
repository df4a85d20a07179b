"""`celerity demo`: train the tiny family under the tau and naive recipes; write collapse.png and report.md.
The library is `celerity_jax/demo.py`."""

import os

from celerity_jax.cli import options
from celerity_jax.demo import SIZES, TARGET_DELTA_OVER_SIGMA, TARGET_RATIO  # demo.py's top imports are light


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("demo", help="train the tiny family under the tau and naive recipes; "
                                           "write collapse.png and report.md")
    options.add_workdir_options(p, default="runs/demo", workdir_help="the demo's directory: a run directory per "
                                                                     "recipe and size, report.md, collapse.png")
    p.add_argument("--quick", action="store_true", help="a small token budget (about 3 minutes)")
    p.add_argument("--sizes", default=",".join(SIZES), help="comma-separated experiments/tiny/<size>.gin names")
    options.add_gin_options(p, required=False, file_help="gin file layered on every run after the demo's own "
                                                         "(a variant of both recipes)")
    p.set_defaults(func=demo_command)


def demo_command(args) -> int:
    from celerity_jax import demo

    sizes = tuple(s for s in args.sizes.split(",") if s)
    report = demo.run_demo(args.workdir, sizes, quick=args.quick, force_new=args.force_new,
                           gin_files=tuple(args.gin_file), gin_params=tuple(args.gin_param))
    print(f"\ncollapse spread on the eval curves (mean |l - family mean| over t̂ in [0.2, 1]): tau "
          f"{report['tau']['mean_abs_dev']:.4f}, naive {report['naive']['mean_abs_dev']:.4f}, ratio "
          f"{report['ratio']:.2f} (target >= {TARGET_RATIO})")
    if report["supercollapse"]:
        print(f"tau family: spread across sizes / seed noise (Δ/σ) {report['supercollapse']['ratio']:.2f} "
              f"(target <= {TARGET_DELTA_OVER_SIGMA})")
    print(f"wrote {os.path.join(args.workdir, 'report.md')} and {os.path.join(args.workdir, 'collapse.png')}")
    return 0
