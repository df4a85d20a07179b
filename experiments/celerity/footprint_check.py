"""The footprint model (`celerity_jax/aot/footprint.py`) against XLA's bytes per chip, on every step the Celerity
searches compiled (the rows of tpu_plans.json with XLA's bytes, or of earlier copies of it given with --plans,
each step once); compiles nothing.

    python experiments/celerity/footprint_check.py [--plans JSON ...] [--json PATH]

Prints one row per compiled step (model ÷ XLA) and the range of that ratio by remat: what `aot/search.py`'s
SURE_FITS and SLACK rest on.
"""

import argparse
import json
import os
import sys

import jax

from celerity_jax import gin_config
from celerity_jax.aot import footprint
from celerity_jax.aot.row import Row
from celerity_jax.fileio import write_json_atomic

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", nargs="+", metavar="JSON", default=[os.path.join(HERE, "tpu_plans.json")],
                        help="tpu_plans.json files whose compiled steps to compare (default: this folder's)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows there")
    args = parser.parse_args(argv)
    jax.config.update("jax_platforms", "cpu")
    missing = [path for path in args.plans if not os.path.isfile(path)]
    if missing:
        parser.error(f"--plans: no such file: {', '.join(missing)} (give tpu_plans.json files)")
    searches = []
    for path in args.plans:
        with open(path) as f:
            searches += json.load(f)
    rows, seen = [], set()
    print("| size | slice | mesh | microbatches | remat | XLA GB | model GB | model ÷ XLA |\n|---|---|---|---|---|---|---|---|")
    for search in searches:
        configs = gin_config.parse_gin([os.path.join(HERE, f"{search['size']}_20tpp.gin")])
        for row in map(Row.from_json, search["tried"]):
            setting = row.setting
            key = (search["size"], search["topology"], setting.mesh_shape, setting.microbatches, setting.remat)
            if row.skipped or not row.bytes_per_chip or key in seen:
                continue
            seen.add(key)
            model = footprint.of_setting(configs, search["topology"], setting).total
            rows.append({"size": search["size"], "topology": search["topology"], "mesh_shape": list(setting.mesh_shape),
                         "microbatches": setting.microbatches, "remat": setting.remat, "xla_bytes": row.bytes_per_chip,
                         "model_bytes": model})
            print(f"| {search['size']} | {search['topology']} | {setting.mesh_shape} | {setting.microbatches} | "
                  f"{setting.remat} | {row.bytes_per_chip / 1e9:.1f} | {model / 1e9:.1f} | "
                  f"{model / row.bytes_per_chip:.2f} |", flush=True)
    for remat in ("none", "dots", "full"):
        ratios = [r["model_bytes"] / r["xla_bytes"] for r in rows if r["remat"] == remat]
        if ratios:
            print(f"remat {remat}: model ÷ XLA {min(ratios):.2f}–{max(ratios):.2f} over {len(ratios)} steps")
    if args.json:
        write_json_atomic(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
