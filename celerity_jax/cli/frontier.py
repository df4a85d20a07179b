"""`celerity frontier`: average downstream accuracy against training FLOPs for runs scored by `celerity eval`,
next to the Celerity paper's published points, with the paper's form Acc = 100 − (C/C₀)^(−k) fitted to the runs.

Every input is read and the fit made before anything is written; the figure and the table are written
atomically into --out.
"""

import os

from celerity_jax.cli import options
from celerity_jax.fileio import check_output_dir, write_text_atomic

FIGURE = "frontier.png"
TABLE = "frontier.md"


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("frontier", help="plot downstream accuracy against training FLOPs, next to the "
                                               "paper's published points, and fit the paper's form")
    p.add_argument("results", nargs="+", metavar="RESULT_OR_RUN",
                   help="a result JSON written by `celerity eval`, or a run directory (its newest "
                        "downstream/step_<S>.json)")
    p.add_argument("--out", required=True, metavar="DIR", help=f"folder to write {FIGURE} and {TABLE} into")
    p.add_argument("--no-published", dest="no_published", action="store_true",
                   help="leave out the paper's published points")
    options.add_json_option(p, "the points and the fits")
    p.set_defaults(func=frontier_command)


def frontier_command(args) -> int:
    from celerity_jax.evaluate import frontier

    check_output_dir(args.out, "--out")
    options.check_json(args.json)
    points = frontier.load_points(args.results)
    fit = frontier.fit_frontier([p.flops for p in points], [p.accuracy for p in points])
    published = None if args.no_published else frontier.load_published()
    figure, table_path = os.path.join(args.out, FIGURE), os.path.join(args.out, TABLE)
    table = frontier.frontier_table(points, fit, published)
    os.makedirs(args.out, exist_ok=True)
    frontier.plot_frontier(points, published, fit, figure)
    write_text_atomic(table_path, table + "\n")
    summary = frontier.frontier_summary(points, fit, published) | {"figure": figure, "table": table_path}
    if options.emit_json(args.json, summary):
        return 0
    print(table)
    print(f"\nwrote {figure} and {table_path}")
    return 0
