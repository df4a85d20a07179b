"""`celerity coordcheck`: draw the coordinate-check figure and print the final-step RMS table."""

import argparse
import os

from celerity_jax.errors import ConfigError


def add_commands(subparsers) -> None:
    from celerity_jax.model.config import PARAMETRIZATIONS  # plain constants, no jax

    p = subparsers.add_parser("coordcheck", help="coordinate check of the parametrizations (a few CPU minutes)")
    p.add_argument("--out", default="coordcheck.png", help="figure path (png, pdf, svg)")
    p.add_argument("--modes", default="standard,completep", help=f"comma list of {', '.join(PARAMETRIZATIONS)}")
    p.add_argument("--widths", default="64,128,256,512", help="d_model values, multiples of 16, at depth min(depths)")
    p.add_argument("--depths", default="2,4,8,16", help="layer counts, at width min(widths)")
    p.add_argument("--steps", type=int, default=10, help="Adam steps")
    p.add_argument("--lr", type=float, default=1e-2, help="base learning rate")
    p.add_argument("--experts", type=int, default=1, help="experts per MLP (1: dense; more: a mixture of experts)")
    p.add_argument("--router", default="topk", help="the mixture's router: topk or hash")
    p.add_argument("--experts-per-token", type=int, default=1, help="experts each token goes to (top-k router)")
    p.set_defaults(func=coordcheck_command)


def coordcheck_command(args: argparse.Namespace) -> int:
    from celerity_jax import coordcheck  # imports jax
    from celerity_jax.model.config import PARAMETRIZATIONS

    modes = tuple(args.modes.split(","))
    if not set(modes) <= set(PARAMETRIZATIONS):
        raise ConfigError(f"--modes={args.modes!r}: use a comma list of {', '.join(PARAMETRIZATIONS)}")
    widths = _ints(args.widths, "--widths", coordcheck.CoordCheckConfig.head_dim)
    depths = _ints(args.depths, "--depths")
    if args.steps < 1 or not args.lr > 0:
        raise ConfigError("--steps must be >= 1 and --lr > 0")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise ConfigError(f"--out={args.out!r}: directory {out_dir} does not exist; create it first")
    cc = coordcheck.CoordCheckConfig(widths=widths, depths=depths, fixed_depth=min(depths),
                                     fixed_width=min(widths), steps=args.steps, base_lr=args.lr,
                                     n_experts=args.experts, router=args.router,
                                     experts_per_token=args.experts_per_token)
    try:
        coordcheck.model_config(cc, modes[0], widths[0], depths[0])
    except ConfigError as e:
        raise ConfigError(f"--experts/--router/--experts-per-token: {e}") from None
    results = coordcheck.run(cc, modes)
    coordcheck.plot(results, args.out)
    print(f"step-{args.steps} RMS (spread = max/min over the sweep)")
    for mode, by_sweep in results.items():
        for sweep, res in by_sweep.items():
            for q in coordcheck.QUANTITIES:
                final = res[q][:, -1]
                values = " ".join(f"{s}:{v:.3g}" for s, v in zip(res["sizes"], final))
                print(f"{mode:>10} {sweep:>5} {q:>12}  {values}  spread {coordcheck.spread(final):.2f}")
    print(f"wrote {args.out}")
    return 0


def _ints(text: str, flag: str, multiple_of: int = 1) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 or v % multiple_of for v in values):
        raise ConfigError(f"{flag}={text!r} must be a comma list of positive multiples of {multiple_of}")
    return values
