"""Per-chip memory of a compiled train step, and the check that refuses a step that does not fit.

The bytes of a step are those of its arguments, temporaries and outputs, less the outputs that reuse an
argument's buffer (the donated train state). XLA:TPU refuses at compile time a program that does not fit
its HBM; XLA:GPU compiles it, so the bytes are also compared with the device's memory limit.
"""

import re

import jax

from celerity_jax.errors import ConfigError
from celerity_jax.model import sharding
from celerity_jax.model.config import REMATS

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


class OutOfMemory(Exception):
    """XLA refused to compile the step: it does not fit. `required_bytes` is what XLA named (or 0)."""

    def __init__(self, message: str, required_bytes: float):
        super().__init__(message)
        self.required_bytes = required_bytes


def bytes_per_chip(compiled) -> int:
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def compile_step(lowered):
    """`lowered.compile()`, raising OutOfMemory when XLA reports that the program exceeds the chip's memory."""
    try:
        return lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        message = str(e)
        if "RESOURCE_EXHAUSTED" not in message:
            raise
        summary = " ".join(message.split())[:300]
        raise OutOfMemory(summary, _required_bytes(summary)) from None


def _required_bytes(message: str) -> float:
    """The bytes XLA says the program needs ("Used 49.34G of 32.00G hbm", or "temporaries (1.66T) exceeds"), 0 if
    it names none."""
    size = re.search(r"Used (\d+(?:\.\d+)?)([KMGTP]?) of", message) or re.search(
        r"\((\d+(?:\.\d+)?)([KMGTP]?)\) exceeds", message)
    return float(size.group(1)) * _UNITS[size.group(2)] if size else 0.0


def fix_hint(microbatches: int, batch_seqs: int, data_shards: int, remat: str) -> str:
    """What to change when a step does not fit."""
    most = batch_seqs // data_shards
    hints = []
    if microbatches < most:
        hints.append(f"raise TrainConfig.microbatches (now {microbatches}; at most {most}, one sequence per "
                     "data shard)")
    if remat != REMATS[-1]:
        hints.append(f"set ModelConfig.remat = '{REMATS[REMATS.index(remat) + 1]}' (keeps less for the backward pass)")
    hints.append("shard over more chips (TrainConfig.mesh_shape, a larger slice)")
    return "; ".join(hints) + ". `celerity compile --gin-file ... --topology SLICE --search` finds settings that fit"


def compile_train_step(build, plan, train_cfg, model_cfg):
    """Compiles the run's train step before anything is written, and refuses one that does not fit a device."""
    hint = fix_hint(train_cfg.microbatches, plan.batch_seqs, sharding.data_shards(build.mesh), model_cfg.remat)
    try:
        compiled = compile_step(build.lower(plan.batch_seqs, plan.seq_len))
    except OutOfMemory as e:
        raise ConfigError(f"the train step does not fit the device's memory (XLA: {e}); {hint}") from None
    device = jax.local_devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit", 0)
    needed = bytes_per_chip(compiled)
    if limit and needed > limit:
        raise ConfigError(f"the train step needs {needed / 1e9:.1f} GB per device but {device.device_kind} "
                          f"has {limit / 1e9:.1f} GB; {hint}")
    return compiled
