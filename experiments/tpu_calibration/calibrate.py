"""Calibrates `celerity compile`'s TPU estimates against published measurements; writes CALIBRATION.md.

    python experiments/tpu_calibration/calibrate.py [--cache-dir DIR]

Each measurement of celerity_jax/aot/tpu_calibration.json is compiled at its gin file's shape, batch, mesh and
remat for its slice (`compile_report` with estimates "always": XLA's estimate is made whether or not our step fits
the chip). The measured tokens/s per chip is the published one, or the published TFLOP/s per chip divided by the
publisher's FLOPs per token. The ratio measured ÷ estimated of each run and, from two runs on, the fit of
`aot.calibration` are written back into the data file (its 'points' and 'fit', null with fewer runs); the table, with the compile time on this host, goes to
CALIBRATION.md beside this script.
"""

import argparse
import os
import statistics
import sys
import time

import jax

from celerity_jax import gin_config, markdown, recipe
from celerity_jax.aot import calibration
from celerity_jax.aot.cache import DEFAULT_CACHE, Cache
from celerity_jax.aot.compile import compile_report
from celerity_jax.fileio import write_json_atomic, write_text_atomic
from celerity_jax.model import params

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def publisher_flops_per_token(convention: str, model_cfg, seq_len: int) -> float:
    """FLOPs per token as the publisher counted them. "maxtext_2024": MaxText's calculate_training_tflops of
    2023–24, 6·N (N all parameters, embeddings included) plus causal attention 6·layers·heads·head_dim·L."""
    if convention != "maxtext_2024":
        raise ValueError(f"unknown FLOPs convention {convention!r}")
    return (6.0 * params.count_params(model_cfg)
            + 6.0 * model_cfg.n_layers * model_cfg.n_heads * model_cfg.head_dim * seq_len)


def measured_tokens_per_chip(published: dict, model_cfg, seq_len: int) -> float:
    if "tokens_per_sec_per_chip" in published:
        return published["tokens_per_sec_per_chip"]
    return published["tflops_per_chip"] * 1e12 / publisher_flops_per_token(published["flops_convention"],
                                                                           model_cfg, seq_len)


def cached_files(directory: str | None) -> int:
    return len(os.listdir(directory)) if directory and os.path.isdir(directory) else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", dest="cache_dir", default=DEFAULT_CACHE, metavar="DIR",
                        help="compile results cache (as `celerity compile`)")
    args = parser.parse_args(argv)
    jax.config.update("jax_platforms", "cpu")  # compile-only, as `celerity compile`
    # A calibration starts from none: the reports it compiles must not carry an earlier one.
    data = dict(calibration.load(), points=[], fit=None)
    write_json_atomic(calibration.PATH, data)
    calibration.load.cache_clear()
    points, started = [], time.time()
    for m in data["measurements"]:
        configs = gin_config.parse_gin([os.path.join(ROOT, m["gin"])])
        before, t0 = cached_files(args.cache_dir), time.time()
        print(f"== {m['name']}: {m['gin']} on {m['topology']}", flush=True)
        report = compile_report(configs, m["topology"], cache=Cache(args.cache_dir or None), estimates="always")
        if not report["est_step_seconds"]:
            print(f"no estimate: {report['estimate_note']}", file=sys.stderr)
            return 1
        plan = recipe.make_plan(configs.model, configs.recipe)
        measured = measured_tokens_per_chip(m["published"], configs.model, plan.seq_len)
        estimated = report["est_tokens_per_sec"] / report["chips"]
        points.append({
            "name": m["name"], "chip": report["chip"], "topology": m["topology"],
            "remat": report["remat"], "mesh_shape": report["mesh_shape"], "params": plan.n_params,
            "measured_tokens_per_sec_per_chip": measured, "est_tokens_per_sec_per_chip": estimated,
            "ratio": measured / estimated, "est_mfu": report["est_mfu"], "measured_mfu": report["est_mfu"] * measured
            / estimated, "published_mfu": m["published"].get("mfu"), "fits_our_model": report["fits"],
            "xla_over_model_flops": report["xla_flops_per_step"] / report["model_flops_per_step"],
            "bytes_per_chip": report["bytes_per_chip"], "seconds": round(time.time() - t0, 1),
            "new_compiles": cached_files(args.cache_dir) - before})
        print(f"   measured {measured:,.0f} tokens/s/chip, estimated {estimated:,.0f}: ratio {points[-1]['ratio']:.3f}"
              f" ({points[-1]['seconds']:.0f} s)", flush=True)
    data["points"], data["fit"] = points, calibration.fit(points) if len(points) >= calibration.MIN_POINTS else None
    write_json_atomic(calibration.PATH, data)
    write_text_atomic(os.path.join(HERE, "CALIBRATION.md"), table(data, time.time() - started))
    print(f"wrote {calibration.PATH} and {os.path.join(HERE, 'CALIBRATION.md')}")
    return 0


def table(data: dict, seconds: float) -> str:
    f, points = data["fit"], data["points"]
    sources = {m["name"]: m for m in data["measurements"]}
    rows = [[p["name"], p["remat"], tuple(p["mesh_shape"]), f"{p['params'] / 1e9:.1f}B",
             f"{p['measured_tokens_per_sec_per_chip']:,.0f}", f"{p['measured_mfu']:.0%}",
             f"{p['est_tokens_per_sec_per_chip']:,.0f}", f"{p['est_mfu']:.0%}", f"{p['xla_over_model_flops']:.2f}",
             f"{p['bytes_per_chip'] / 1e9:.0f}" + ("" if p["fits_our_model"] else " (no)"), f"{p['ratio']:.2f}",
             f"{calibration.ratio(p['chip'], f):.2f}" if f else "—", f"{p['seconds']:.0f} ({p['new_compiles']} new)"]
            for p in points]
    lines = [
        "<!-- generated by `python experiments/tpu_calibration/calibrate.py`; do not edit by hand -->",
        "# Calibration of `celerity compile`'s TPU estimates against published measurements",
        "",
        "Each row: a published training run (source below), compiled by `celerity compile` in this project's model "
        "at the same shape, per-chip batch, mesh and remat for the same slice (gin files beside this table). "
        "Measured tokens/s per chip: as published, or the published TFLOP/s per chip ÷ the publisher's FLOPs per "
        "token. Measured MFU here counts our model FLOPs (6N + full attention) at the measured speed, so it is "
        "comparable with est. MFU (the publisher's own MFU is in the sources). XLA FLOPs / model FLOPs: what XLA's "
        "cost analysis counted against the model FLOPs of the same step. Our GB/chip: what our step needs at that "
        "setting, and whether it fits the chip (the estimate is made either way). Ratio = measured ÷ estimated "
        "tokens/s; fitted = the ratio of the row's chip (the geometric mean of its runs). Only runs whose model "
        "this project builds are compiled; the published runs left out are listed at the end, with why.",
        "",
    ]
    lines += markdown.table(["run", "remat", "mesh (data, fsdp, tensor)", "params", "measured tokens/s/chip",
                             "measured MFU", "est. tokens/s/chip", "est. MFU", "XLA FLOPs / model FLOPs", "our GB/chip (fits?)",
                             "ratio", "fitted", "s (compiles not cached)"], rows)
    lines += ["", fit_line(f, points), ""]
    lines += [
        f"This run took {seconds / 60:.1f} minutes on this host (2 CPU cores); each row's seconds include its "
        "compiles not found in `--cache-dir`, counted in brackets; from an empty cache, a row's compiles take "
        "minutes.",
        "",
        "## Sources",
        "",
    ]
    for p in points:
        m = sources[p["name"]]
        published = ", ".join(f"{k} {v}" for k, v in m["published"].items())
        lines += [f"- **{m['name']}** ({m['by']}; {published}): {m['source']}. Configuration: {m['config_source']}. "
                  f"What differs: {m['differs']}."]
    if data.get("dropped"):
        lines += ["", "## Published runs left out", ""]
        lines += [f"- **{d['name']}** ({', '.join(f'{k} {v}' for k, v in d['published'].items())}; {d['source']}): "
                  f"{d['why']}." for d in data["dropped"]]
    return "\n".join(lines) + "\n"


def fit_line(f: dict | None, points: list[dict]) -> str:
    ratios = sorted(p["ratio"] for p in points)
    if f is None:
        return (f"No fit: {len(points)} run{'s' if len(points) != 1 else ''} of a model this project builds "
                f"(ratio {', '.join(f'{r:.2f}' for r in ratios)}), and a fit needs {calibration.MIN_POINTS}, since "
                "its band is their spread. `celerity compile` gives no calibrated expectation until then.")
    runs = ", ".join(f"{chip} {r:.3f} ({f['runs_by_chip'][chip]} run{'s' if f['runs_by_chip'][chip] > 1 else ''})"
                     for chip, r in f["ratio_by_chip"].items())
    return (f"Fit: one ratio per chip, {runs}; largest log residual about a chip's ratio "
            f"{f['max_abs_log_residual']:.3f} (rms {f['rms_log_residual']:.3f})"
            + (f"; leave-one-out rms within a chip {f['rms_log_loo']:.3f}" if f["rms_log_loo"] is not None else "")
            + f". All ratios {ratios[0]:.2f}–{ratios[-1]:.2f} (median {statistics.median(ratios):.2f}).")


if __name__ == "__main__":
    sys.exit(main())
