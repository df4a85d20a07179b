"""`celerity train`: train (or resume) one run, named by its gin files, bindings and workdir, through
`celerity_jax.run`."""

import argparse
import sys

# Seconds without a heartbeat after which a process counts as lost (JAX's own default is 100).
HEARTBEAT_TIMEOUT_S = 10


def add_commands(subparsers) -> None:
    from celerity_jax.cli import options

    p = subparsers.add_parser("train", help="train (or resume) one run from gin configs")
    options.add_gin_options(p)
    options.add_workdir_options(p)
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: call jax.distributed.initialize() (auto-detected on Cloud TPU and SLURM)")
    p.add_argument("--coordinator-address", help="multi-host: host:port of process 0 (implies --distributed)")
    p.add_argument("--num-processes", type=int, help="multi-host: number of processes")
    p.add_argument("--process-id", type=int, help="multi-host: this process's index")
    p.add_argument("--heartbeat-timeout", type=int, default=HEARTBEAT_TIMEOUT_S, metavar="SECONDS",
                   help="multi-host: a process silent this long counts as lost, and the others stop "
                        f"(default {HEARTBEAT_TIMEOUT_S})")
    p.add_argument("--verbose", action="store_true",
                   help="library logs and full tracebacks on the console too (else in <workdir>/celerity.log); "
                        "CELERITY_VERBOSE=1 does the same")
    p.set_defaults(func=train_command)


def train_command(args: argparse.Namespace) -> int:
    from celerity_jax.train import interrupts, logfile, supervisor

    if (args.coordinator_address or args.distributed) and not supervisor.is_child():
        # a lost process is then reported in one line (train/supervisor.py)
        return supervisor.train_supervised(sys.argv[1:], args.process_id, args.heartbeat_timeout)
    if supervisor.is_child():
        supervisor.end_with_supervisor()
    logfile.send_library_output_to_log(args.workdir, args.verbose or logfile.verbose_from_env())
    with interrupts.handled():  # before JAX starts: an early Ctrl-C must not land inside its callbacks
        import jax

        if args.coordinator_address:  # before anything else touches JAX
            jax.distributed.initialize(args.coordinator_address, args.num_processes, args.process_id,
                                       heartbeat_timeout_seconds=args.heartbeat_timeout)
        elif args.distributed:
            jax.distributed.initialize(heartbeat_timeout_seconds=args.heartbeat_timeout)
        from celerity_jax import run

        interrupts.raise_if_requested()
        the_run = run.load(run.RunSpec(args.workdir, tuple(args.gin_file), tuple(args.gin_param)))
        summary = the_run.train_to(force_new=args.force_new, verbose=args.verbose)
    if jax.process_index() != 0:
        return 0
    if summary is None:
        done, last = the_run.steps_done(), the_run.last_step
        where = "its last step" if done == last else f"past its last step {last}"
        print(f"nothing to train: {args.workdir} is at step {done}/{the_run.plan.steps}, {where}")
        return 0
    skipped = summary["skipped_steps"]
    note = f" ({skipped} steps skipped: loss not finite)" if skipped else ""
    print(f"{summary['stopped']} at step {summary['final_step']}/{summary['steps']}{note}: {args.workdir}")
    return 0
