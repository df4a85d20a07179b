"""`celerity plan`, `celerity plan-table` and `celerity tau`: the recipe planner on the command line."""

import glob
import os
import sys

from celerity_jax.cli import options
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_text_atomic

PLAN_TABLE_GLOB = "experiments/celerity/*tpp.gin"


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("plan", help="derive a run's optimizer settings from gin configs")
    options.add_gin_options(p, required=False, file_help="gin file; repeat to layer")
    p.add_argument("--preset",
                   help="start the model from this preset (gin ModelConfig bindings override it)")
    options.add_json_option(p, "the plan")
    p.add_argument("--ema-plot", dest="ema_plot", metavar="PNG",
                   help="plot the Straight-to-Zero EMA weights of this plan against other schedules")
    p.set_defaults(func=plan_command)

    p = subparsers.add_parser("plan-table", help="write the markdown table of the plans of gin files")
    p.add_argument("gin_files", nargs="*", metavar="GIN", help=f"gin files (default: {PLAN_TABLE_GLOB})")
    p.add_argument("--out", default="experiments/celerity/PLANS.md", help="markdown file to write")
    p.set_defaults(func=plan_table_command)

    p = subparsers.add_parser("tau", help="the AdamW timescale τ = B/(η·λ·D) of any recipe")
    p.add_argument("--batch-tokens", dest="batch_tokens", type=float, required=True, metavar="B",
                   help="tokens per optimizer step B")
    p.add_argument("--lr", type=float, required=True, metavar="ETA", help="peak LR η of the hidden matrices")
    p.add_argument("--wd", type=float, required=True, metavar="LAMBDA", help="decoupled weight decay λ")
    p.add_argument("--tokens", type=float, required=True, metavar="D", help="training tokens D")
    p.set_defaults(func=tau_command)


def plan_command(args) -> int:
    from celerity_jax import gin_config, plan_report, recipe
    from celerity_jax.model import presets
    from celerity_jax.model.params import count_active_params

    options.check_json(args.json)
    base = {"model": presets.preset(args.preset)} if args.preset else None
    configs = gin_config.parse_gin(args.gin_file, args.gin_param, base=base)
    plan = recipe.make_plan(configs.model, configs.recipe)
    if args.ema_plot:
        print(f"wrote {plan_report.plot_ema_weights(plan, args.ema_plot)}", file=sys.stderr)
    if args.json is None:
        active = count_active_params(configs.model) if configs.model.n_experts > 1 else None
        print(plan_report.format_plan(plan, active))
    else:
        options.emit_json(args.json, plan.to_dict())
    return 0


def plan_table_command(args) -> int:
    from celerity_jax import gin_config, plan_report, recipe

    gin_files = args.gin_files or sorted(glob.glob(PLAN_TABLE_GLOB))
    if not gin_files:
        raise ConfigError(f"no gin files given and none match {PLAN_TABLE_GLOB}; run from the repo root")
    rows = []
    for path in gin_files:
        configs = gin_config.parse_gin([path])
        rows.append((os.path.basename(path), recipe.make_plan(configs.model, configs.recipe)))
    rows.sort(key=lambda row: (row[1].n_params, row[1].tpp))
    command = " ".join(["celerity plan-table", *args.gin_files])
    write_text_atomic(args.out, plan_report.plan_table(rows, command) + "\n")
    print(f"wrote {args.out} ({len(rows)} plans)")
    return 0


def tau_command(args) -> int:
    from celerity_jax import recipe

    tau = recipe.tau_from(args.batch_tokens, args.lr, args.wd, args.tokens)
    steps = args.tokens / args.batch_tokens
    print(f"tau = {tau:.4g}  (EMA timescale 1/(lr*wd) = {1 / (args.lr * args.wd):,.0f} steps "
          f"of T = {steps:,.0f})")
    return 0
