"""Accelerator chips and slices: the names users type, the devices jax compiles for, and per-chip facts.

A slice name is the one Cloud TPU uses (`v5p-8`, `v5litepod-16`, `v6e-64`) or `h100-8` / `h200-16` for
NVIDIA GPUs (8 per host). v4 and v5p names count TensorCores (2 per chip, used as one megacore device);
v5e and v6e names count chips. `compile_devices` builds compile-only devices of a slice on any host:
TPU slices through libtpu, GPU slices through the CUDA PJRT plugin with a target description of the GPU.
The chip facts and their sources: docs/accelerators.md.
"""

import contextlib
import dataclasses
import importlib.util
import os
import platform
import re
import tempfile
from importlib import metadata

from celerity_jax.errors import ConfigError

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    device_kinds: tuple[str, ...]  # jax's Device.device_kind for this chip
    platform: str  # "tpu" or "cuda"
    hbm_bytes: float  # per chip (vendor data sheet)
    peak_flops: float  # dense bf16 FLOP/s per chip (vendor data sheet)


CHIPS = {
    "v4": Chip("v4", ("TPU v4",), "tpu", 32 * GiB, 275e12),
    "v5e": Chip("v5e", ("TPU v5 lite", "TPU v5e"), "tpu", 16 * GiB, 197e12),
    "v5p": Chip("v5p", ("TPU v5", "TPU v5p"), "tpu", 95 * GiB, 459e12),
    "v6e": Chip("v6e", ("TPU v6 lite", "TPU v6e"), "tpu", 32 * GiB, 918e12),
    "h100": Chip("h100", ("NVIDIA H100 80GB HBM3", "NVIDIA H100"), "cuda", 80e9, 989e12),
    "h200": Chip("h200", ("NVIDIA H200 141GB HBM3e", "NVIDIA H200"), "cuda", 141e9, 989e12),
    "a100": Chip("a100", ("NVIDIA A100",), "cuda", 80e9, 312e12),
    "l4": Chip("l4", ("NVIDIA L4",), "cuda", 24e9, 121e12),
}
SLICE_ALIASES = {"v5litepod": "v5e"}
COMPILE_TARGETS = ("v4", "v5p", "v5e", "v6e", "h100", "h200")
SLICE_FORMS = ("v4-8, v4-16, … and v5p-8, v5p-16, … (TensorCores, 2 per chip, a power of two); v5e-4 / "
               "v5litepod-4 … 256 and v6e-4 … 256 (chips: 1, 4, 8, 16, 32, 64, 128, 256); h100-N and h200-N "
               "(GPUs: 1–8, or a multiple of 8)")
GPUS_PER_HOST = 8
TPU_PLUGIN = "libtpu"
CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")
# PCI vendor ids of accelerators JAX can drive: Google (TPU), NVIDIA, AMD graphics.
ACCELERATOR_PCI_VENDORS = {"0x1ae0", "0x10de", "0x1002"}
# JAX preallocates this fraction of a GPU's memory by default (XLA_PYTHON_CLIENT_MEM_FRACTION), which bounds a step.
GPU_DEFAULT_MEM_FRACTION = 0.75


def peak_flops_per_device(device_kind: str, override: float = 0.0) -> float:
    """Dense bf16 peak FLOP/s of one device of this kind, `override` if > 0, or 0 when unknown."""
    if override > 0:
        return override
    for chip in CHIPS.values():
        if device_kind in chip.device_kinds:
            return chip.peak_flops
    for chip in CHIPS.values():  # e.g. "NVIDIA H100 PCIe" when only "NVIDIA H100" is listed
        if any(device_kind.startswith(kind) for kind in chip.device_kinds):
            return chip.peak_flops
    return 0.0


@dataclasses.dataclass(frozen=True)
class Slice:
    name: str  # as the user typed it
    chip: Chip
    chips: int
    topology: str  # jax's topology string, e.g. "v5p:2x2x1"; for GPUs "<slices>x<hosts>x<per host>"

    @property
    def target(self) -> str:
        """Names the compile target: the chip and its arrangement."""
        return self.topology if self.chip.platform == "tpu" else f"{self.chip.name}:{self.topology}"


def parse_slice(name: str) -> Slice:
    """A Slice from a name such as v5p-8, v5litepod-16, v6e-64 or h100-8; ConfigError listing the forms."""
    m = re.fullmatch(r"([a-z0-9]+)-(\d+)", name.strip().lower())
    kind = SLICE_ALIASES.get(m.group(1), m.group(1)) if m else None
    if kind not in COMPILE_TARGETS:
        raise ConfigError(f"--topology {name!r} is not a slice name; use {SLICE_FORMS}")
    count, chip = int(m.group(2)), CHIPS[kind]
    if kind in ("v4", "v5p"):
        chips, dims = count // 2, _cube_dims(count // 2) if count % 2 == 0 else None
    elif kind in ("v5e", "v6e"):
        chips, dims = count, _grid_dims(count)
    else:
        chips, dims = count, _gpu_dims(count)
    if dims is None:
        raise ConfigError(f"--topology {name!r} is not an available slice size; use {SLICE_FORMS}")
    shape = "x".join(map(str, dims))
    return Slice(name, chip, chips, shape if chip.platform == "cuda" else f"{kind}:{shape}")


def _gpu_dims(gpus: int) -> tuple[int, int, int] | None:
    """(slices, hosts, GPUs per host)."""
    if 1 <= gpus <= GPUS_PER_HOST:
        return 1, 1, gpus
    return (1, gpus // GPUS_PER_HOST, GPUS_PER_HOST) if gpus > 0 and gpus % GPUS_PER_HOST == 0 else None


def _cube_dims(chips: int) -> tuple[int, int, int] | None:
    """3D torus of v4/v5p slices: 4 chips 2x2x1, 8 2x2x2, 16 2x2x4, 32 2x4x4, 64 4x4x4, 128 4x4x8, ..."""
    if chips < 4 or chips & (chips - 1):
        return None
    dims = [2, 2, 1]
    while dims[0] * dims[1] * dims[2] < chips:  # double the smallest side, the last of equals
        dims[max(range(3), key=lambda i: (-dims[i], i))] *= 2
    return tuple(dims)


def _grid_dims(chips: int) -> tuple[int, int] | None:
    """2D torus of v5e/v6e slices."""
    return {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16),
            256: (16, 16)}.get(chips)


def usable_bytes(chip: Chip) -> float:
    """The memory one step may use: a TPU's HBM; on a GPU the fraction JAX preallocates."""
    if chip.platform != "cuda":
        return chip.hbm_bytes
    return chip.hbm_bytes * float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", GPU_DEFAULT_MEM_FRACTION))


def compile_devices(slice_: Slice) -> list:
    """Compile-only jax devices of the slice (no accelerator needed); ConfigError naming what to install."""
    from jax.experimental import topologies

    if slice_.chip.platform == "tpu":
        if not _installed(TPU_PLUGIN):
            raise ConfigError(f"compiling for {slice_.name} needs libtpu; install it with "
                              "`pip install -e '.[tpu]'` (about 700 MB)")
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only use beside a process on the chips
        kwargs = {"chip_config_name": "megacore"} if slice_.chip.name in ("v4", "v5p") else {}
        if slice_.chips in (1, 8) and slice_.chip.name in ("v5e", "v6e"):  # single-host slices
            kwargs["chips_per_host_bounds"] = (2, 4, 1) if slice_.chips == 8 else (1, 1, 1)
        with _quiet_native_stderr():
            return list(topologies.get_topology_desc(topology_name=slice_.topology, platform="tpu", **kwargs).devices)
    if not any(_installed(m) for m in CUDA_PLUGINS):
        raise ConfigError(f"compiling for {slice_.name} needs the CUDA PJRT plugin; install it with "
                          "`pip install -e '.[cuda-compile]'` (or use a host with jax[cuda12])")
    with open(os.path.join(os.path.dirname(__file__), "gpu_targets", f"{slice_.chip.name}.txtpb")) as f:
        target = f.read()
    with _quiet_native_stderr():
        return list(topologies.get_topology_desc(platform="cuda", topology=slice_.topology, target_config=target).devices)


def libtpu_version() -> str:
    """The installed libtpu's version, "" without one."""
    try:
        return metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return ""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package (jax_plugins) is absent
        return False


@contextlib.contextmanager
def _quiet_native_stderr():
    """libtpu and the CUDA plugin print start-up warnings (no TPU host, no GPU) from native code straight to
    file descriptor 2. They are held back here and shown only if the call fails."""
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            os.write(2, held.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def pin_cpu_without_accelerators(sysfs: str = "/sys/bus/pci/devices") -> None:
    """With libtpu or the CUDA plugin installed on a host that has neither a TPU nor a GPU, JAX probes them at
    start-up: warnings on the console and a slower start. Pin JAX to the CPU there (JAX_PLATFORMS, when unset).
    A host counts as having an accelerator when a PCI device of a known vendor is present, as JAX itself checks."""
    if "JAX_PLATFORMS" in os.environ or not any(_installed(m) for m in (TPU_PLUGIN, *CUDA_PLUGINS)):
        return
    if not _has_accelerator(sysfs):
        os.environ["JAX_PLATFORMS"] = "cpu"


def _has_accelerator(sysfs: str) -> bool:
    try:
        devices = os.listdir(sysfs)
    except OSError:  # no PCI view (some containers): assume one may be there, and leave JAX to probe
        return True
    for device in devices:
        try:
            with open(os.path.join(sysfs, device, "vendor")) as f:
                if f.read().strip().lower() in ACCELERATOR_PCI_VENDORS:
                    return True
        except OSError:
            continue
    return False


def host_cpu_name() -> str:
    """This host's CPU model, as /proc/cpuinfo names it (where there is one), for benchmark records."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()
