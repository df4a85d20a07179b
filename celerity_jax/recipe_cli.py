"""`celerity plan`, `celerity plan-table` and `celerity tau`: the recipe planner on the command line."""

import glob
import os
import sys

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_text_atomic

PLAN_TABLE_GLOB = "experiments/celerity/*tpp.gin"


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("plan", help="derive a run's optimizer settings from gin configs")
    p.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    p.add_argument("--gin_param", action="append", default=[],
                   help="gin binding, e.g. RecipeConfig.tpp=80 (repeatable)")
    p.add_argument("--preset",
                   help="start the model from this preset (gin ModelConfig bindings override it)")
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="print the plan as JSON, or write it (atomically) to PATH")
    p.add_argument("--ema_plot", metavar="PNG",
                   help="plot the Straight-to-Zero EMA weights of this plan against other schedules")
    p.set_defaults(func=plan_command)

    p = subparsers.add_parser("plan-table", help="write the markdown table of the plans of gin files")
    p.add_argument("gin_files", nargs="*", help=f"gin files (default: {PLAN_TABLE_GLOB})")
    p.add_argument("--out", default="experiments/celerity/PLANS.md", help="markdown file to write")
    p.set_defaults(func=plan_table_command)

    p = subparsers.add_parser("tau", help="the AdamW timescale τ = B/(η·λ·D) of any recipe")
    p.add_argument("--batch-tokens", "--batch_tokens", dest="batch_tokens", type=float, required=True,
                   help="tokens per optimizer step B")
    p.add_argument("--lr", type=float, required=True, help="peak LR η of the hidden matrices")
    p.add_argument("--wd", type=float, required=True, help="decoupled weight decay λ")
    p.add_argument("--tokens", type=float, required=True, help="training tokens D")
    p.set_defaults(func=tau_command)


def plan_command(args) -> int:
    from celerity_jax import gin_config, recipe
    from celerity_jax.model import presets

    base = {"model": presets.preset(args.preset)} if args.preset else None
    configs = gin_config.parse_gin(args.gin_file, args.gin_param, base=base)
    plan = recipe.make_plan(configs["model"], configs["recipe"])
    if args.ema_plot:
        _plot_ema(plan, args.ema_plot)
    if args.json == "-":
        print(plan.to_json())
    elif args.json:
        write_text_atomic(args.json, plan.to_json() + "\n")
        print(f"wrote {args.json}")
    else:
        print(format_plan(plan))
    return 0


def plan_table_command(args) -> int:
    from celerity_jax import gin_config, recipe

    gin_files = args.gin_files or sorted(glob.glob(PLAN_TABLE_GLOB))
    if not gin_files:
        raise ConfigError(f"no gin files given and none match {PLAN_TABLE_GLOB}; run from the repo root")
    rows = []
    for path in gin_files:
        configs = gin_config.parse_gin([path])
        rows.append((os.path.basename(path), recipe.make_plan(configs["model"], configs["recipe"])))
    rows.sort(key=lambda row: (row[1].n_params, row[1].tpp))
    command = " ".join(["celerity plan-table", *args.gin_files])
    write_text_atomic(args.out, plan_table(rows, command) + "\n")
    print(f"wrote {args.out} ({len(rows)} plans)")
    return 0


def tau_command(args) -> int:
    from celerity_jax import recipe

    tau = recipe.tau_from(args.batch_tokens, args.lr, args.wd, args.tokens)
    steps = args.tokens / args.batch_tokens
    print(f"tau = {tau:.4g}  (EMA timescale 1/(lr*wd) = {1 / (args.lr * args.wd):,.0f} steps "
          f"of T = {steps:,.0f})")
    return 0


def format_plan(plan) -> str:
    """The plan as aligned `name  value` lines."""
    rows = [
        ("N (parameters)", f"{plan.n_params:,} ({plan.n_params:.3g})"),
        ("TPP", f"{plan.tpp:g}"),
        ("D (tokens)", f"{plan.tokens:,} ({plan.tokens:.3g})"),
        ("T (steps)", f"{plan.steps:,}"),
        ("B (batch)", f"{plan.batch_seqs} seqs × {plan.seq_len} = {plan.batch_tokens:,} tokens"),
        ("warmup", f"{plan.warmup_steps:,} steps"),
        ("schedule", plan.schedule),
        *((f"peak LR {role}", f"{lr:.4g}") for role, lr in plan.lr_peak.items()),
        ("weight decay λ", f"{plan.weight_decay:.4g}"),
        ("τ", f"{plan.tau:.4g} = B/(η_hidden·λ·D); EMA timescale τ·T = "
              f"{plan.tau * plan.steps:,.0f} steps"),
        ("Adam b1, b2, eps", f"{plan.adam_b1:g}, {plan.adam_b2:g}, {plan.adam_eps:g}"),
        ("grad clip", f"{plan.grad_clip:g}" if plan.grad_clip > 0 else "off"),
        ("train FLOPs", f"{plan.train_flops:.3e} ({plan.flops_per_token:.3e} per token)"),
        *((f"band {b['tpp']:g} TPP", f"{b['tokens']:.3e} tokens, {b['flops']:.3e} FLOPs")
          for b in plan.bands),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def plan_table(rows, command: str) -> str:
    """Markdown table of (name, Plan) rows."""
    lines = [
        f"<!-- generated by `{command}`; do not edit by hand -->",
        "| config | N | TPP | D (tokens) | B (seqs) | T (steps) | warmup | η_hidden | λ | τ | FLOPs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in rows:
        lines.append(
            f"| `{name}` | {_count(p.n_params)} | {p.tpp:g} | {_count(p.tokens)} | "
            f"{p.batch_seqs} | {p.steps:,} | {p.warmup_steps:,} | {p.lr_hidden:.4g} | "
            f"{p.weight_decay:.4g} | {p.tau:.3g} | {p.train_flops:.2e} |")
    return "\n".join(lines)


def _count(n: float) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def _plot_ema(plan, path: str) -> None:
    import jax.numpy as jnp

    from celerity_jax import schedules

    steps = jnp.arange(plan.steps)
    lrs = {}
    for name in schedules.SCHEDULES:
        schedule = schedules.make_schedule(name, plan.steps, plan.warmup_steps, plan.wsd_decay_frac)
        label = f"{name} (this plan)" if name == plan.schedule else name
        lrs[label] = plan.lr_hidden * schedule(steps)
    schedules.plot_ema_coefficients(lrs, plan.weight_decay, path)
    print(f"wrote {path}", file=sys.stderr)
