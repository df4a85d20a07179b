"""`celerity sweep`: a hyperparameter sweep of one model, stopped early by predicting final losses.

For every value of one swept gin binding (`--sweep 'RecipeConfig.tau=0.2,0.4,0.8'`) the sweep needs
reference normalized curves with the same collapse controls (TPP, τ, schedule; docs/science.md §6). It
trains them on smaller models (`--reference-model`, cheap; once per setting, since τ is a control, or once
for all settings with `--shared-references` when the swept binding leaves the controls alone, e.g. the
batch at fixed τ), or takes them as files (`--reference`, `--reference-for`). It trains the target model
of every setting, predicts each setting's final loss at every checkpoint fraction by early-align
against its references (by the method `--method` names, or the one chosen per fraction from all the settings'
references alone) and ranks the settings. With `--stop-at F
--keep K` only the K best by the prediction at F train past F; the others keep a checkpoint at F, so a
rerun with a larger `--keep` (or without `--stop-at`) finishes them. Rerunning a command resumes it.
With `--storage URL` the settings are the trials of an Optuna study that any number of workers take (the same
command on several hosts, or `--workers N` here), stopped by the collapse pruner from `--stop-at` on
(sweep/study.py); without it the sweep runs here, one setting after another.
The library is `celerity_jax/sweep/` (its workdir layout: runner.py).
"""

import os
import sys

from celerity_jax.cli import options
from celerity_jax.sweep.spec import METHODS  # spec.py imports only the standard library and errors.py


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="sweep one gin binding on a model; predict final losses early "
                                            "from smaller reference models and stop the losers")
    p.add_argument("--model", required=True, help="gin file of the swept (target) model size, e.g. "
                                                  "experiments/tiny/d80.gin")
    p.add_argument("--sweep", required=True, metavar="BINDING=V1,V2,...",
                   help="the swept binding and its values, e.g. 'RecipeConfig.tau=0.2,0.4,0.8'")
    options.add_gin_options(p, required=False, file_help="gin file layered after each run's size file (every "
                                                         "run of the sweep); repeatable")
    p.add_argument("--reference-model", action="append", default=[], metavar="GIN",
                   help="gin file of a smaller size trained as reference (per setting); repeatable")
    p.add_argument("--shared-references", action="store_true",
                   help="train the --reference-model runs once, without the swept binding (only when it "
                        "leaves TPP, τ and schedule alone)")
    p.add_argument("--reference", default="", metavar="PATH[,PATH...]",
                   help="reference JSONs or finished CURVEs used for every setting")
    p.add_argument("--reference-for", action="append", default=[], metavar="VALUE=PATH[,PATH...]",
                   help="the references of one setting; repeatable")
    p.add_argument("--fractions", default="0.1,0.2,0.3", metavar="F1,F2,...", help="fractions of training to predict at")
    p.add_argument("--stop-at", type=float, metavar="F", help="train every setting to this fraction, then only the --keep best")
    p.add_argument("--keep", type=int, default=1, metavar="K", help="settings trained past --stop-at (also the what-if "
                                                       "decisions of the summary)")
    p.add_argument("--method", choices=METHODS, default="auto",
                   help="nearest: the reference size nearest in log N; family: the family-aware curve of all "
                        "references at the target's N; shrunk: family with unresolved slopes shrunk (3 sizes or "
                        "more); auto: at each fraction the one that predicts the references' own sizes best, "
                        "nearest unless another is better beyond the noise")
    p.add_argument("--align-start", type=float, default=0.5, metavar="A",
                   help="at fraction f, early-align over t̂ in [A·f, f]")
    options.add_workdir_options(p, workdir_help="the sweep's directory: its summary and a run directory per "
                                                "run (created, or resumed)")
    p.add_argument("--force", action="store_true", help="accept references whose controls differ")
    p.add_argument("--storage", metavar="URL",
                   help="run the settings as the trials of an Optuna study kept here, which any number of workers "
                        "take (the same command on each host): sqlite:///PATH on one machine, journal:PATH on a "
                        "shared filesystem, postgresql://USER@HOST/DB for a cluster (a file or a server: not an "
                        "in-memory database); needs --stop-at, from which the collapse pruner stops the settings "
                        "that cannot beat the best (the `sweep` extra)")
    p.add_argument("--study-name", metavar="NAME", help="the study in --storage (default: the workdir's name)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="with --storage: N worker processes here")
    p.set_defaults(func=sweep_command)


def sweep_command(args) -> int:
    from celerity_jax.errors import ConfigError
    from celerity_jax.sweep import report, runner, spec
    from celerity_jax.train import lock

    sweep_spec = spec.spec_from_args(args)
    if args.storage is not None:
        summary = _study_workers(sweep_spec, args.storage, args.study_name or os.path.basename(
            os.path.abspath(args.workdir)), args.workers)
        if summary is None:
            return 0
    elif args.workers != 1 or args.study_name is not None:
        raise ConfigError("--workers and --study-name apply to a study: add --storage URL (e.g. sqlite:///sweep.db)")
    else:
        with lock.locked(sweep_spec.workdir):
            summary = runner.run_sweep(sweep_spec)
    print("\n" + report.render_markdown(summary))
    print(f"wrote {os.path.join(args.workdir, 'sweep.json')} and {os.path.join(args.workdir, 'sweep.md')}")
    return 0


def _study_workers(sweep_spec, storage: str, name: str, workers: int) -> dict | None:
    """One worker here, or `workers` worker processes; the summary when this host's workers finished the study."""
    import multiprocessing

    from celerity_jax.errors import ConfigError
    from celerity_jax.sweep import study

    if workers < 1:
        raise ConfigError(f"--workers {workers}: give at least 1")
    if workers == 1:
        return study.run_worker(sweep_spec, storage, name)
    _, _, opened = study.open_sweep(sweep_spec, storage, name)  # bad input stops here, in one line
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_worker, args=(sweep_spec, storage, name)) for _ in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [p.exitcode for p in procs if p.exitcode]
    # the others take over the trial of a worker killed here: the study may be done all the same
    if failed and opened.get_trials(deepcopy=False, states=(study.TrialState.RUNNING, study.TrialState.WAITING)):
        raise ConfigError(f"{len(failed)} of {workers} workers failed or were killed (any output of theirs is "
                          "above); rerun the command: it resumes the study")
    if failed:
        print(f"\n{len(failed)} of {workers} workers failed or were killed; the others took over their trials")
    return study.summary(sweep_spec, storage, name)


def _worker(sweep_spec, storage: str, name: str) -> None:
    """One of the `--workers N` processes: an error it stops on is one line, as the command's own would be."""
    from celerity_jax.errors import ConfigError, RunStopped
    from celerity_jax.sweep import study

    try:
        study.run_worker(sweep_spec, storage, name)
    except ConfigError as e:
        sys.exit(f"celerity sweep: error: {e}")
    except RunStopped as e:
        sys.exit(f"celerity sweep: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
