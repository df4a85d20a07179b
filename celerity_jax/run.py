"""One run: what names it (gin files, bindings, workdir), what that gives (configs, plan, identity, operative
gin), how far it has got, and training it to a step.

`celerity train`, the demo, the sweep and every experiment start, resume and judge runs through here. A run
has got as far as the last step of its curve.csv; it is finished at the plan's last step.
"""

import dataclasses
import functools
import json
import os
import time
from collections.abc import Iterable

from celerity_jax import gin_config, rundir
from celerity_jax.collapse.controls import Controls
from celerity_jax.collapse.files import load_curve
from celerity_jax.configs import RunConfigs, RunDefinition
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import write_json_atomic
from celerity_jax.recipe import Plan
from celerity_jax.rundir.identity import Identity


@dataclasses.dataclass(frozen=True)
class RunSpec:
    workdir: str
    gin_files: tuple[str, ...]
    gin_params: tuple[str, ...] = ()
    name: str = ""  # what logs call it, e.g. "tau/d48"; when set, `train_to` announces what it trains


@dataclasses.dataclass(frozen=True)
class Run:
    spec: RunSpec
    definition: RunDefinition

    @property
    def configs(self) -> RunConfigs:
        return self.definition.configs

    @property
    def plan(self) -> Plan:
        return self.definition.plan

    @property
    def identity(self) -> Identity:
        return self.definition.identity

    @property
    def workdir(self) -> str:
        return self.spec.workdir

    @property
    def name(self) -> str:
        return self.spec.name or self.workdir

    @property
    def last_step(self) -> int:
        """Where training stops: the plan's end, or TrainConfig.stop_at_step when that comes first."""
        return self.definition.last_step

    @property
    def controls(self) -> Controls:
        return Controls.from_plan(self.plan)

    def steps_done(self) -> int:
        """The last step in the run's curve.csv (0 if none). A workdir that holds a different run is refused."""
        rundir.check_workdir(self.workdir, self.identity, force_new=False)
        path = os.path.join(self.workdir, rundir.CURVE_CSV)
        if not os.path.isfile(path):
            return 0
        with open(path) as f:
            if sum(1 for line in f if line.strip()) < 2:
                return 0
        return int(load_curve(self.workdir).step_T[-1])

    def finished(self) -> bool:
        return self.steps_done() >= self.plan.steps

    def train_to(self, step: int | None = None, *, force_new: bool = False, verbose: bool = False, log=print,
                 train_fn=None) -> dict | None:
        """Trains (or resumes) the run up to `step` (default: `last_step`) unless it is there already; returns
        the trainer's summary, or None when there was nothing to train. With `force_new`, a workdir holding a
        different run is archived (inside it) instead of refused. The time taken adds up in timing.json.
        A named run first logs `== <name>: steps <done> -> <step> of <plan steps>`."""
        until = min(self.last_step, step or self.last_step)
        try:
            done, archive = self.steps_done(), False
        except ConfigError:
            if not force_new:
                raise
            done, archive = 0, True
        done = _as_process_zero_sees_it(done)
        if done >= until:
            return None
        if self.spec.name:
            log(f"\n== {self.spec.name}: steps {done} -> {until} of {self.plan.steps}")
        definition = self.definition.stopping_at(until) if until < self.last_step else self.definition
        if train_fn is None:
            from celerity_jax.train.loop import train as train_fn
        start = time.time()
        summary = train_fn(definition, self.workdir, force_new=archive, verbose=verbose, log=log)
        self._add_seconds(time.time() - start)
        return summary

    def train_seconds(self) -> float:
        """Wall-clock seconds spent in `train_to` on this run so far (compilation included)."""
        path = os.path.join(self.workdir, rundir.TIMING_JSON)
        if not os.path.isfile(path):
            return 0.0
        with open(path) as f:
            return float(json.load(f)["train_seconds"])

    def _add_seconds(self, seconds: float) -> None:
        import jax

        if jax.process_index() == 0 and os.path.isdir(self.workdir):
            write_json_atomic(os.path.join(self.workdir, rundir.TIMING_JSON),
                              {"train_seconds": self.train_seconds() + seconds})


def _as_process_zero_sees_it(steps_done: int) -> int:
    """Only process 0 writes the run directory, which other hosts may not see: all follow its count, so that
    all of them train, or none."""
    import jax

    if jax.process_count() == 1:
        return steps_done
    import numpy as np
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(steps_done)))


def train_all(specs: Iterable[RunSpec], log=functools.partial(print, flush=True), train_fn=None) -> None:
    """Trains (or resumes) each run to its end without its own log, then logs one line for it: its name, steps,
    tokens and the seconds this took (0 for a run already finished). Experiments train their runs this way."""
    for spec in specs:
        loaded = load(spec)
        start = time.time()
        loaded.train_to(log=lambda *args, **kwargs: None, train_fn=train_fn)
        log(f"{loaded.name}: {loaded.plan.steps} steps, {loaded.plan.tokens:,} tokens, {time.time() - start:.0f} s")


def load(spec: RunSpec) -> Run:
    """Parses the run's gin files and bindings (once) and derives its plan and identity."""
    configs = gin_config.parse_gin(spec.gin_files, spec.gin_params)
    return Run(spec, RunDefinition.of(configs, gin_config.operative_config_str()))
