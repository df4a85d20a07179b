"""Compile a run's train step for a slice, on any host, and report memory, fit and XLA's estimates.

The step is the one `celerity train` runs (`train.step.build_step`, `train.memory.compile_step`), with every
"auto" model choice made for the slice's platform. A StepSetting overrides the four knobs that trade memory
for speed; each compile's result is cached on disk, keyed by everything that changes the compiled program.
"""

import contextlib
import dataclasses
import functools
import time
from typing import Any

import jax

from celerity_jax import accelerators, recipe
from celerity_jax.aot import calibration, estimate
from celerity_jax.aot.cache import Cache
from celerity_jax.errors import ConfigError
from celerity_jax.model import sharding
from celerity_jax.train import memory, step as step_lib

ESTIMATE_NOTE = ("est_* values are XLA's cost-model estimates for the compiled program (TPU only), not "
                 "measurements")


@dataclasses.dataclass(frozen=True)
class StepSetting:
    """The four knobs of a train step that trade memory for speed: what a search tries and a compile applies."""
    mesh_shape: tuple[int, int, int]
    microbatches: int
    remat: str
    scan_layers: bool

    @classmethod
    def of(cls, configs) -> "StepSetting":
        return cls(tuple(configs.train.mesh_shape), configs.train.microbatches, configs.model.remat,
                   configs.model.scan_layers)

    @classmethod
    def of_report(cls, report: dict) -> "StepSetting":
        """The setting of a compile report, or of a search row's JSON."""
        return cls(tuple(report["mesh_shape"]), report["microbatches"], report["remat"], report["scan_layers"])

    def gin_params(self) -> list[str]:
        return [f"TrainConfig.mesh_shape = {tuple(self.mesh_shape)}", f"TrainConfig.microbatches = {self.microbatches}",
                f"ModelConfig.remat = '{self.remat}'", f"ModelConfig.scan_layers = {self.scan_layers}"]


@functools.cache
def slice_devices(name: str) -> tuple[accelerators.Slice, list]:
    slice_ = accelerators.parse_slice(name)
    return slice_, accelerators.compile_devices(slice_)


def apply_setting(configs, setting: StepSetting, platform: str):
    """The run's configs with the setting applied and "auto" resolved for `platform`."""
    model = dataclasses.replace(configs.model.for_platform(platform), remat=setting.remat,
                                scan_layers=setting.scan_layers)
    train = dataclasses.replace(configs.train, mesh_shape=tuple(setting.mesh_shape), microbatches=setting.microbatches)
    return dataclasses.replace(configs, model=model, train=train)


@dataclasses.dataclass(frozen=True)
class Target:
    """A run with a setting applied for a slice: what every compile of its step (and its footprint) starts from."""
    slice_: accelerators.Slice
    run: Any  # RunConfigs with the setting applied and "auto" resolved for the slice's platform
    plan: Any
    mesh: Any

    @classmethod
    def of(cls, configs, topology: str, setting: StepSetting) -> "Target":
        slice_, devices = slice_devices(topology)
        run = apply_setting(configs, setting, slice_.chip.platform)
        return cls(slice_, run, recipe.make_plan(run.model, run.recipe),
                   sharding.make_mesh(run.train.mesh_shape, devices=devices))

    @property
    def micro_seqs(self) -> int:
        return self.plan.batch_seqs // self.run.train.microbatches

    def build(self) -> step_lib.StepBuild:
        """The train step `celerity train` would run on this mesh."""
        return step_lib.build_step(self.run.model, self.plan, self.run.monitor, self.mesh,
                                   microbatches=self.run.train.microbatches, z_loss=self.run.train.z_loss,
                                   seed=self.run.train.seed)


@contextlib.contextmanager
def without_persistent_cache():
    """Compile-only executables cannot be loaded back, so they stay out of JAX's persistent compilation cache."""
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)


def compile_report(configs, topology: str, setting: StepSetting | None = None, *, cache: Cache = Cache(None),
                   estimates: str = "fits") -> dict:
    """Compiles the train step of `configs` (with `setting`, default: the configs' own) for the slice `topology`.

    Raises ConfigError when the setting cannot be built (mesh, batch split) or XLA fails for another reason; a
    step that does not fit is reported with fits False. XLA's step-time estimate is made when the step fits
    (`estimates` "fits"), always ("always": it is assembled from loop-free pieces, `aot.estimate`, which compile
    whether or not the step fits), never ("never": memory and fit only), or without compiling the step ("only":
    fits and the memory are then None)."""
    with without_persistent_cache():
        try:
            return _compile_report(configs, topology, setting or StepSetting.of(configs), cache, estimates)
        except jax.errors.JaxRuntimeError as e:
            raise ConfigError(f"XLA could not compile the step for {topology}: {' '.join(str(e).split())[:300]}") from None


def _compile_report(configs, topology: str, setting: StepSetting, cache: Cache, estimates: str) -> dict:
    target = Target.of(configs, topology, setting)
    slice_, run, plan, mesh = target.slice_, target.run, target.plan, target.mesh
    setting = dataclasses.replace(setting, mesh_shape=tuple(mesh.shape[axis] for axis in sharding.MESH_AXES))
    sharding.check_batch_divisible(plan.batch_seqs, mesh, setting.microbatches)
    build = target.build()
    if estimates == "only":
        step = {"bytes_per_chip": None, "error": None, "compile_seconds": None}
    else:
        lowered = build.lower(plan.batch_seqs, plan.seq_len)
        step = cache("step", lowered, slice_.target, lambda: _compile_step(lowered))
    usable = accelerators.usable_bytes(slice_.chip)
    model_flops = plan.flops_per_token * plan.batch_tokens
    report = {
        "topology": slice_.name, "chip": slice_.chip.name, "chips": slice_.chips, **build.setting(plan),
        "batch_seqs": plan.batch_seqs, "steps": plan.steps,
        "hbm_bytes_per_chip": slice_.chip.hbm_bytes, "usable_bytes_per_chip": usable,
        "bytes_per_chip": step["bytes_per_chip"],
        "fits": None if estimates == "only" else step["error"] is None and step["bytes_per_chip"] <= usable,
        "headroom": 1.0 - step["bytes_per_chip"] / usable if step["bytes_per_chip"] else None,
        "compile_seconds": step["compile_seconds"],
        "error": step["error"], "model_flops_per_step": model_flops,
        "xla_flops_per_step": None, "est_step_seconds": None, "est_tokens_per_sec": None, "est_mfu": None,
        "est_days": None, "est_chip_hours": None, "estimate_note": ESTIMATE_NOTE,
        "gin_params": setting.gin_params(),
    }
    if estimates in ("always", "only") or (estimates == "fits" and report["fits"]):
        report.update(_estimates(run, plan, build, mesh, slice_, cache, model_flops))
    report["calibrated"] = calibration.expected(report)
    return report


@dataclasses.dataclass(frozen=True)
class UpdatePiece:
    """The update of one step: the same program for every microbatch count and remat of a mesh."""

    def compile(self, t: Target, cache: Cache) -> None:
        estimate.update_cost(t.build(), t.plan, t.mesh, cache, t.slice_.target)


@dataclasses.dataclass(frozen=True)
class GradientPiece:
    """The gradient of one microbatch at depth `n_layers`, layers unrolled, `loss_unroll` loss chunks per
    iteration of its loop (`estimate.gradient_piece`)."""
    n_layers: int
    loss_unroll: int

    def compile(self, t: Target, cache: Cache) -> None:
        estimate.gradient_piece(t.run.model, t.micro_seqs, t.plan.seq_len, t.mesh, t.run.train.z_loss, cache,
                                t.slice_.target, self.n_layers, self.loss_unroll)


def estimate_pieces(configs, topology: str, setting: StepSetting) -> list[UpdatePiece | GradientPiece]:
    """The loop-free compiles behind the setting's step-time estimate; `compile_piece` compiles one into the
    cache, so that they can run side by side."""
    target = Target.of(configs, topology, setting)
    return [UpdatePiece()] + [GradientPiece(*piece) for piece in estimate.gradient_pieces(
        target.run.model, target.micro_seqs, target.plan.seq_len, target.mesh)]


def compile_piece(configs, topology: str, setting: StepSetting, piece: UpdatePiece | GradientPiece,
                  cache: Cache) -> None:
    """Compiles one of `estimate_pieces` into `cache`."""
    target = Target.of(configs, topology, setting)
    with without_persistent_cache():
        piece.compile(target, cache)


def _compile_step(lowered) -> dict:
    start = time.perf_counter()
    try:
        compiled = memory.compile_step(lowered)
    except memory.OutOfMemory as e:
        return {"bytes_per_chip": e.required_bytes, "error": str(e),
                "compile_seconds": round(time.perf_counter() - start, 1)}
    return {"bytes_per_chip": memory.bytes_per_chip(compiled), "error": None,
            "compile_seconds": round(time.perf_counter() - start, 1)}


def _estimates(run, plan, build, mesh, slice_, cache, model_flops: float) -> dict:
    if slice_.chip.platform != "tpu":
        return {"estimate_note": f"XLA gives no cost analysis when compiling for {slice_.chip.name} without the "
                "device: memory and fit only"}
    micro_seqs = plan.batch_seqs // run.train.microbatches
    gradient = estimate.gradient_cost(run.model, micro_seqs, plan.seq_len, mesh, run.train.z_loss, cache,
                                      slice_.target)
    update = estimate.update_cost(build, plan, mesh, cache, slice_.target)
    if gradient is None or update is None:
        return {"estimate_note": f"XLA gave no usable cost analysis for {slice_.chip.name}: memory and fit only"}
    step = estimate.combine((1.0, update), (run.train.microbatches, gradient))
    seconds = step["optimal_seconds"]
    return {"xla_flops_per_step": step["flops"] * slice_.chips, "est_step_seconds": seconds,
            "est_tokens_per_sec": plan.batch_tokens / seconds,
            "est_mfu": model_flops / (slice_.chips * slice_.chip.peak_flops * seconds),
            "est_days": plan.steps * seconds / 86400, "est_chip_hours": slice_.chips * plan.steps * seconds / 3600}
