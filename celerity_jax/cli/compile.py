"""`celerity compile`: compile a run's train step for a TPU or GPU slice on this host (no accelerator needed)."""

import os

from celerity_jax.cli import options


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("compile", help="compile the train step for a TPU/GPU slice: memory, fit and "
                              "XLA's step-time estimate, without the accelerator")
    options.add_gin_options(p, required=True, file_help="gin file, as for `celerity train`; repeat to layer")
    p.add_argument("--topology", required=True,
                   help="slice name: v4-8, v5p-8, v5e-16 / v5litepod-16, v6e-64, h100-8, h200-16, ...")
    p.add_argument("--search", action="store_true",
                   help="try meshes, microbatches, remat and scan_layers; report the fastest that fits with 10%% "
                   "headroom, with what was tried")
    p.add_argument("--budget", type=float, metavar="MINUTES",
                   help="with --search: stop after MINUTES and report the best setting found so far")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="with --search: compile in N processes (default: one per CPU)")
    options.add_json_option(p, "the report")
    p.add_argument("--cache-dir", dest="cache_dir", metavar="DIR",
                   help="where compile results are kept and reused (default $XDG_CACHE_HOME/celerity/compile, "
                        "else ~/.cache/celerity/compile); '' for none")
    p.set_defaults(func=compile_command)


def compile_command(args) -> int:
    import jax

    jax.config.update("jax_platforms", "cpu")  # compile-only: never take the local accelerator, if any
    from celerity_jax import accelerators, gin_config
    from celerity_jax.errors import ConfigError
    from celerity_jax.aot.cache import DEFAULT_CACHE, Cache
    from celerity_jax.aot.compile import compile_report, slice_devices
    from celerity_jax.aot.report import check_writable, format_report, nothing_fits
    from celerity_jax.aot.search import search, search_summary

    accelerators.parse_slice(args.topology)  # a bad name fails before gin and compiles
    if (args.budget is not None or args.jobs is not None) and not args.search:
        raise ConfigError("--budget and --jobs apply to --search; add --search or drop them")
    if (args.budget is not None and args.budget <= 0) or (args.jobs is not None and args.jobs < 1):
        raise ConfigError("--budget takes a positive number of minutes and --jobs a positive count")
    options.check_json(args.json)
    cache_dir = DEFAULT_CACHE if args.cache_dir is None else args.cache_dir
    if cache_dir:
        check_writable(cache_dir, "--cache-dir")
    configs = gin_config.parse_gin(args.gin_file, args.gin_param)
    slice_, _ = slice_devices(args.topology)
    cache = Cache(cache_dir or None)
    quiet = args.json == "-"
    log = (lambda _: None) if quiet else (lambda line: print(line, flush=True))
    log(f"compiling {', '.join(args.gin_file)} for {slice_.name}: {slice_.chips} × {slice_.chip.name}, "
        f"{slice_.chip.hbm_bytes / 1e9:.1f} GB each")
    if args.search:
        found = search(configs, args.topology, cache=cache, jobs=args.jobs or os.cpu_count() or 1,
                       budget_seconds=None if args.budget is None else 60 * args.budget, log=log)
        report = found.best.to_json() if found.best else {"fits": False, "error": (
            "the search stopped before any setting was found to fit; rerun with a larger --budget (what it "
            "compiled is cached)" if found.stopped else nothing_fits(found.tried))}
        report.update(tried=[row.to_json() for row in found.tried],
                      search={"stopped": found.stopped, "seconds": found.seconds, "compiles": found.compiles})
        log(search_summary(found))
    else:
        report = compile_report(configs, args.topology, cache=cache)
    options.emit_json(args.json, report)
    if not quiet:
        print(format_report(report))
    if args.search and report["search"]["stopped"] == "interrupted":
        from celerity_jax.train.interrupts import EXIT_CODE

        return EXIT_CODE
    return 0 if report["fits"] else 1
