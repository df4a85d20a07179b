"""A run's configs: TrainConfig (how a run is executed: mesh, logging, checkpoints, faults), RunConfigs (all five
configs of a run, as gin_config parses them) and RunDefinition (the configs with their plan and identity).

What is trained (model, recipe, data, monitor) lives in those packages' own configs. TrainConfig sits here, below
train/, because gin_config, which train/ uses, reads it too.
"""

import dataclasses

from celerity_jax.collapse.config import MonitorConfig
from celerity_jax.config_types import check_field_types
from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.sharding import MESH_AXES
from celerity_jax.recipe import Plan, RecipeConfig, make_plan
from celerity_jax.rundir.identity import Identity


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    # (data, fsdp, tensor); one -1 takes the remaining devices.
    mesh_shape: tuple[int, int, int] = (-1, 1, 1)
    microbatches: int = 1
    z_loss: float = 0.0
    log_every: int = 10
    eval_every: int = 100
    # Also evaluate at the middle of each of this many equal parts of t̂ (steps round((k − ½)·T/eval_points)),
    # the same t̂ for every size of a family and clear of the edges of any grid of eval_points/m bins;
    # eval.csv holds the eval curve. 0: only every eval_every steps.
    eval_points: int = 0
    eval_batches: int = 4
    checkpoint_every: int = 500
    keep_last: int = 3
    keep_every: int = 0
    async_checkpointing: bool = True
    # Non-finite losses tolerated (their updates are skipped) before the run stops.
    max_bad_steps: int = 0
    # Weight of the EMA behind `train/loss_smooth`.
    loss_ema: float = 0.98
    # Accelerator peak FLOP/s for perf/mfu; 0 looks the device up in celerity_jax.accelerators.CHIPS.
    peak_flops_per_sec: float = 0.0
    # Stop (with a checkpoint) once this global step is reached; 0 runs to the end of the plan.
    stop_at_step: int = 0
    # Reference JSONs for the in-loop collapse monitor (several sizes: the family-aware curve).
    collapse_reference: tuple[str, ...] = ()
    # Use references whose controls (TPP, tau, schedule) differ from the run's.
    force_reference: bool = False
    # Start this (new) run from another run's checkpoint: its run directory (newest checkpoint) or one
    # checkpoint, `<run>/checkpoints/<step>`. Params, optimizer moments, step, monitor curve and data
    # position carry over; this run's config (e.g. a new weight decay) applies from there on. Used only
    # while the workdir has no checkpoint of its own (see celerity_jax/train/init_from.py).
    init_from: str = ""
    # Downstream scores in the loop (train/downstream.py): lm-evaluation-harness tasks named as `celerity eval
    # --tasks` names them, scored at t̂ = k/downstream_points (k = 1..downstream_points) on the first
    # downstream_limit documents of each (0: all), with data from downstream_data_dir (stock tasks only).
    downstream_tasks: tuple[str, ...] = ()
    downstream_points: int = 0
    downstream_limit: int = 0
    downstream_data_dir: str = ""
    downstream_batch_size: int = 16

    def __post_init__(self):
        check_field_types(self)
        if self.mesh_shape.count(-1) > 1 or any(s == 0 or s < -1 for s in self.mesh_shape):
            raise ConfigError(f"TrainConfig.mesh_shape={self.mesh_shape}: give 3 positive sizes for "
                              f"{MESH_AXES}, at most one of them -1 (all remaining devices)")
        for name in ("microbatches", "log_every", "eval_batches", "checkpoint_every", "keep_last",
                     "downstream_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TrainConfig.{name}={getattr(self, name)} must be >= 1")
        for name in ("eval_every", "eval_points", "keep_every", "max_bad_steps", "stop_at_step", "downstream_points",
                     "downstream_limit"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TrainConfig.{name}={getattr(self, name)} must be >= 0 (0 disables it)")
        if bool(self.downstream_tasks) != bool(self.downstream_points):
            raise ConfigError(f"TrainConfig.downstream_tasks={self.downstream_tasks} and downstream_points="
                              f"{self.downstream_points}: set both (tasks, and how many times to score them) or "
                              "neither")
        if not 0.0 <= self.loss_ema < 1.0:
            raise ConfigError(f"TrainConfig.loss_ema={self.loss_ema} must be in [0, 1)")

    def last_step(self, total_steps: int) -> int:
        """Where training stops: the plan's end (`total_steps`), or stop_at_step when that comes first."""
        return min(total_steps, self.stop_at_step or total_steps)

    def eval_steps(self, total_steps: int) -> frozenset[int]:
        """The steps evaluated besides every eval_every-th: the eval_points spread over t̂, and the last step
        whenever evals are on."""
        n = self.eval_points
        steps = {max(1, round((k - 0.5) * total_steps / n)) for k in range(1, n + 1)} if n else set()
        if self.eval_every or n:
            steps.add(total_steps)
        return frozenset(steps)

    def all_eval_steps(self, total_steps: int) -> frozenset[int]:
        """Every step evaluated: `eval_steps` and every eval_every-th."""
        every = range(self.eval_every, total_steps + 1, self.eval_every) if self.eval_every else ()
        return self.eval_steps(total_steps) | frozenset(every)


@dataclasses.dataclass(frozen=True)
class RunConfigs:
    """The five configs of one run, as `gin_config.parse_gin` builds them."""
    model: ModelConfig
    recipe: RecipeConfig
    data: DataConfig
    train: TrainConfig
    monitor: MonitorConfig

    def __post_init__(self):
        if self.monitor.loss_curve != "eval":
            return
        train, bins = self.train, self.monitor.n_bins
        if not (train.eval_points or train.eval_every):
            raise ConfigError("MonitorConfig.loss_curve='eval' follows the eval loss, but the run never evaluates; "
                              "set TrainConfig.eval_points (e.g. 50, with MonitorConfig.n_bins = 50)")
        if not train.eval_every and bins > train.eval_points:
            raise ConfigError(f"MonitorConfig.n_bins={bins} exceeds TrainConfig.eval_points={train.eval_points}: "
                              "with loss_curve='eval' most bins would hold no eval and the monitor would stay "
                              f"silent; set n_bins to at most {train.eval_points} (and smooth_bins = 1)")


@dataclasses.dataclass(frozen=True)
class RunDefinition:
    """What defines a run wherever it trains: its configs, what they give (computed once, by `of`): its plan and
    identity, and the operative gin that config.gin records ("" when the configs were not parsed from gin)."""
    configs: RunConfigs
    plan: Plan
    identity: Identity
    operative_gin: str = ""

    @classmethod
    def of(cls, configs: RunConfigs, operative_gin: str = "") -> "RunDefinition":
        plan = make_plan(configs.model, configs.recipe)
        return cls(configs, plan, Identity.of(configs, plan), operative_gin)

    @property
    def last_step(self) -> int:
        return self.configs.train.last_step(self.plan.steps)

    def stopping_at(self, step: int) -> "RunDefinition":
        """This run trained up to `step` (TrainConfig.stop_at_step); plan and identity do not depend on it."""
        train = dataclasses.replace(self.configs.train, stop_at_step=step)
        return dataclasses.replace(self, configs=dataclasses.replace(self.configs, train=train))
