"""`celerity compile`: compile a run's train step for a TPU or GPU slice on this host (no accelerator needed)."""

import json
import os

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_text_atomic

DEFAULT_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "celerity", "compile")


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("compile", help="compile the train step for a TPU/GPU slice: memory, fit and "
                              "XLA's step-time estimate, without the accelerator")
    p.add_argument("--gin_file", action="append", required=True, help="gin file, as for `celerity train` (repeatable)")
    p.add_argument("--gin_param", action="append", default=[], help="gin binding, as for `celerity train` (repeatable)")
    p.add_argument("--topology", required=True,
                   help="slice name: v4-8, v5p-8, v5e-16 / v5litepod-16, v6e-64, h100-8, h200-16, ...")
    p.add_argument("--search", action="store_true",
                   help="try meshes, microbatches, remat and scan_layers; report the fastest that fits with 10%% "
                   "headroom, with what was tried")
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="print the report as JSON, or write it (atomically) to PATH")
    p.add_argument("--cache_dir", default=DEFAULT_CACHE,
                   help=f"where compile results are kept and reused (default {DEFAULT_CACHE}); '' for none")
    p.set_defaults(func=compile_command)


def compile_command(args) -> int:
    import jax

    jax.config.update("jax_platforms", "cpu")  # compile-only: never take the local accelerator, if any
    from celerity_jax import accelerators, gin_config
    from celerity_jax.aot.cache import Cache
    from celerity_jax.aot.compile import compile_report, slice_devices
    from celerity_jax.aot.search import search
    from celerity_jax.train.loop import RunConfigs

    accelerators.parse_slice(args.topology)  # a bad name fails before gin and compiles
    if args.json not in (None, "-"):
        check_writable(os.path.dirname(os.path.abspath(args.json)), "--json")
    if args.cache_dir:
        check_writable(args.cache_dir, "--cache_dir")
    configs = RunConfigs(**gin_config.parse_gin(args.gin_file, args.gin_param))
    slice_, _ = slice_devices(args.topology)
    cache = Cache(args.cache_dir or None)
    quiet = args.json == "-"
    log = (lambda _: None) if quiet else print
    log(f"compiling {', '.join(args.gin_file)} for {slice_.name}: {slice_.chips} × {slice_.chip.name}, "
        f"{slice_.chip.hbm_bytes / 1e9:.1f} GB each")
    if args.search:
        best, tried = search(configs, args.topology, cache=cache, log=log)
        report = dict(best) if best else {"fits": False, "error": _nothing_fits(tried)}
        report["tried"] = tried
    else:
        report = compile_report(configs, args.topology, cache=cache)
    if args.json == "-":
        print(json.dumps(report, indent=1))
    elif args.json:
        write_text_atomic(args.json, json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    if not quiet:
        print(format_report(report))
    return 0 if report["fits"] else 1


def _nothing_fits(tried: list[dict]) -> str:
    if tried and all("does not split" in r.get("skipped", "") for r in tried):
        return (f"{tried[0]['skipped']} (nor over any other mesh of this slice): choose a slice whose chip count "
                "divides the batch, or change RecipeConfig.batch_seqs")
    return "no setting tried fits with 10% headroom: try a larger slice (or a shorter RecipeConfig.seq_len)"


def check_writable(directory: str, what: str) -> None:
    """ConfigError unless `directory` is (or can be made) a writable directory."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what}: cannot create {directory!r} ({e.strerror}); pass a writable path") from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(f"{what}: {directory!r} is not writable; pass a writable path")


def format_report(report: dict) -> str:
    if "mesh_shape" not in report:
        return f"nothing fits: {report['error']}"
    lines = [f"setting   mesh (data, fsdp, tensor) {tuple(report['mesh_shape'])}, {report['microbatches']} microbatches, "
             f"remat {report['remat']}, scan_layers {report['scan_layers']}, {report['compute_dtype']}, "
             f"attention {report['attention_impl']}, "
             + (f"loss in chunks of {report['logits_chunk_len']} positions"
                if report["logits_chunk_len"] < report["seq_len"] else "whole logits")]
    gb = report["bytes_per_chip"] / 1e9 if report["bytes_per_chip"] else float("nan")
    verdict = (f"fits, {report['headroom']:.0%} headroom" if report["fits"] else
               f"DOES NOT FIT ({report['error'] or 'over the chip memory'})")
    lines.append(f"memory    {gb:.1f} GB per chip of {report['usable_bytes_per_chip'] / 1e9:.1f} GB usable: {verdict}")
    lines.append(f"compile   {report['compile_seconds']:.1f} s")
    if report.get("est_step_seconds"):
        lines.append(f"estimate* {report['est_step_seconds']:.3f} s/step, {report['est_tokens_per_sec']:,.0f} tokens/s, "
                     f"MFU {report['est_mfu']:.1%}; the plan's {report['steps']:,} steps: {report['est_days']:.2f} days, "
                     f"{report['est_chip_hours']:,.0f} chip-hours")
        lines.append(f"          XLA FLOPs / model FLOPs = {report['xla_flops_per_step'] / report['model_flops_per_step']:.2f}")
    lines.append(f"*         {report['estimate_note']}")
    if report["fits"]:
        lines.append("gin       " + " ".join(f'--gin_param "{p}"' for p in report["gin_params"]))
    else:
        from celerity_jax.aot.memory import fix_hint

        data_shards = report["mesh_shape"][0] * report["mesh_shape"][1]
        lines.append("fix       " + fix_hint(report["microbatches"], report["batch_seqs"], data_shards, report["remat"]))
    return "\n".join(lines)
