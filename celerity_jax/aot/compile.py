"""Compile a run's train step for a slice, on any host, and report memory, fit and XLA's estimates.

The step is the one `celerity train` runs (`train.step.build_step`, `train.memory.compile_step`), with every
"auto" model choice made for the slice's platform. A Setting overrides the four knobs that trade memory for
speed; each compile's result is cached on disk, keyed by everything that changes the compiled program.
"""

import contextlib
import dataclasses
import functools
import time

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
class Setting:
    mesh_shape: tuple[int, int, int]
    microbatches: int
    remat: str
    scan_layers: bool

    @classmethod
    def of(cls, configs) -> "Setting":
        return cls(tuple(configs.train.mesh_shape), configs.train.microbatches, configs.model.remat,
                   configs.model.scan_layers)

    def gin_params(self) -> list[str]:
        return [f"TrainConfig.mesh_shape = {tuple(self.mesh_shape)}", f"TrainConfig.microbatches = {self.microbatches}",
                f"ModelConfig.remat = '{self.remat}'", f"ModelConfig.scan_layers = {self.scan_layers}"]


@functools.cache
def slice_devices(name: str) -> tuple[accelerators.Slice, list]:
    slice_ = accelerators.parse_slice(name)
    return slice_, accelerators.compile_devices(slice_)


def apply_setting(configs, setting: Setting, platform: str):
    """The run's configs with the setting applied and "auto" resolved for `platform`."""
    model = dataclasses.replace(configs.model.for_platform(platform), remat=setting.remat,
                                scan_layers=setting.scan_layers)
    train = dataclasses.replace(configs.train, mesh_shape=tuple(setting.mesh_shape), microbatches=setting.microbatches)
    return dataclasses.replace(configs, model=model, train=train)


@contextlib.contextmanager
def without_persistent_cache():
    """Compile-only executables cannot be loaded back, so they stay out of JAX's persistent compilation cache."""
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)


def compile_report(configs, topology: str, setting: Setting | None = None, *, cache: Cache = Cache(None),
                   estimates: str = "fits") -> dict:
    """Compiles the train step of `configs` (with `setting`, default: the configs' own) for the slice `topology`.

    Raises ConfigError when the setting cannot be built (mesh, batch split) or XLA fails for another reason; a
    step that does not fit is reported with fits False. XLA's step-time estimate is made when the step fits
    (`estimates` "fits"), always ("always": it is assembled from loop-free pieces, `aot.estimate`, which compile
    whether or not the step fits), never ("never": memory and fit only), or without compiling the step ("only":
    fits and the memory are then None)."""
    with without_persistent_cache():
        try:
            return _compile_report(configs, topology, setting or Setting.of(configs), cache, estimates)
        except jax.errors.JaxRuntimeError as e:
            raise ConfigError(f"XLA could not compile the step for {topology}: {' '.join(str(e).split())[:300]}") from None


def _compile_report(configs, topology: str, setting: Setting, cache: Cache, estimates: str) -> dict:
    slice_, devices = slice_devices(topology)
    run = apply_setting(configs, setting, slice_.chip.platform)
    plan = recipe.make_plan(run.model, run.recipe)
    mesh = sharding.make_mesh(run.train.mesh_shape, devices=devices)
    setting = dataclasses.replace(setting, mesh_shape=tuple(mesh.shape[axis] for axis in sharding.MESH_AXES))
    sharding.check_batch_divisible(plan.batch_seqs, mesh, setting.microbatches)
    build = step_lib.build_step(run.model, plan, run.monitor, mesh, microbatches=setting.microbatches,
                                z_loss=run.train.z_loss, seed=run.train.seed)
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


def estimate_pieces(configs, topology: str, setting: Setting) -> list[tuple]:
    """The loop-free compiles behind the setting's step-time estimate: ("update",) and ("gradient", n_layers,
    loss_unroll) each; `compile_piece` compiles one into the cache, so that they can run side by side."""
    slice_, devices = slice_devices(topology)
    run = apply_setting(configs, setting, slice_.chip.platform)
    plan = recipe.make_plan(run.model, run.recipe)
    mesh = sharding.make_mesh(tuple(setting.mesh_shape), devices=devices)
    return [("update",)] + [("gradient", *piece) for piece in estimate.gradient_pieces(
        run.model, plan.batch_seqs // setting.microbatches, plan.seq_len, mesh)]


def compile_piece(configs, topology: str, setting: Setting, piece: tuple, cache: Cache) -> None:
    """Compiles one of `estimate_pieces` into `cache`."""
    slice_, devices = slice_devices(topology)
    run = apply_setting(configs, setting, slice_.chip.platform)
    plan = recipe.make_plan(run.model, run.recipe)
    mesh = sharding.make_mesh(tuple(setting.mesh_shape), devices=devices)
    with without_persistent_cache():
        if piece[0] == "update":
            build = step_lib.build_step(run.model, plan, run.monitor, mesh, microbatches=setting.microbatches,
                                        z_loss=run.train.z_loss, seed=run.train.seed)
            estimate.update_cost(build, plan, mesh, cache, slice_.target)
        else:
            estimate.gradient_piece(run.model, plan.batch_seqs // setting.microbatches, plan.seq_len, mesh,
                                    run.train.z_loss, cache, slice_.target, *piece[1:])


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
