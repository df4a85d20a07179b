"""`celerity train`: parse gin at the entry point, then run `celerity_jax.train.loop.train`."""

from celerity_jax.train import interrupts, rundir


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("train", help="train (or resume) one run from gin configs")
    p.add_argument("--gin_file", action="append", required=True,
                   help="gin file; repeat to layer (model, run, overrides)")
    p.add_argument("--gin_param", action="append", default=[], help="one binding, e.g. 'TrainConfig.seed = 1'")
    p.add_argument("--workdir", required=True, help="run directory: created, or resumed if it holds a checkpoint")
    p.add_argument("--force_new", action="store_true",
                   help="archive a different run found in --workdir (inside it) and start over")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: call jax.distributed.initialize() (auto-detected on Cloud TPU and SLURM)")
    p.add_argument("--coordinator_address", help="multi-host: host:port of process 0 (implies --distributed)")
    p.add_argument("--num_processes", type=int, help="multi-host: number of processes")
    p.add_argument("--process_id", type=int, help="multi-host: this process's index")
    p.add_argument("--verbose", action="store_true",
                   help="library logs and full tracebacks on the console too (else in <workdir>/celerity.log); "
                        "CELERITY_VERBOSE=1 does the same")
    p.set_defaults(func=run_train)


def run_train(args) -> int:
    rundir.send_library_output_to_log(args.workdir, args.verbose or rundir.verbose_from_env())
    with interrupts.handled():  # before JAX starts: an early Ctrl-C must not land inside its callbacks
        import jax

        if args.coordinator_address:
            jax.distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
        elif args.distributed:
            jax.distributed.initialize()
        from celerity_jax import gin_config

        interrupts.raise_if_requested()
        summary = gin_config.train_from_gin(args.gin_file, args.gin_param, args.workdir, force_new=args.force_new,
                                            verbose=args.verbose)
    if jax.process_index() == 0:
        skipped = summary["skipped_steps"]
        note = f" ({skipped} steps skipped: loss not finite)" if skipped else ""
        print(f"{summary['stopped']} at step {summary['final_step']}/{summary['steps']}{note}: {args.workdir}")
    return 0
