import os

import pytest

from celerity_jax import accelerators
from celerity_jax.errors import ConfigError


@pytest.mark.parametrize("name, chip, chips, topology", [
    ("v5p-8", "v5p", 4, "v5p:2x2x1"),
    ("v5p-16", "v5p", 8, "v5p:2x2x2"),
    ("v5p-128", "v5p", 64, "v5p:4x4x4"),
    ("v4-32", "v4", 16, "v4:2x2x4"),
    ("v4-64", "v4", 32, "v4:2x4x4"),
    ("v5e-16", "v5e", 16, "v5e:4x4"),
    ("v5litepod-16", "v5e", 16, "v5e:4x4"),
    ("v5e-8", "v5e", 8, "v5e:2x4"),
    ("v6e-64", "v6e", 64, "v6e:8x8"),
    ("V6E-256", "v6e", 256, "v6e:16x16"),
    ("h100-8", "h100", 8, "1x1x8"),
    ("h200-16", "h200", 16, "1x2x8"),
    ("h200-1", "h200", 1, "1x1x1"),
])
def test_slice_names_map_to_jax_topologies(name, chip, chips, topology):
    s = accelerators.parse_slice(name)
    assert (s.chip.name, s.chips, s.topology) == (chip, chips, topology)


@pytest.mark.parametrize("name", ["v5p-6", "v5p-7", "v5e-12", "v6e-3", "v4-4", "tpu-8", "v5p", "h100-12", "a100-8",
                                  "h100-0"])
def test_bad_slice_names_list_the_valid_forms(name):
    with pytest.raises(ConfigError, match="v4-8.*v5p-8.*v5litepod-4.*h100-N"):
        accelerators.parse_slice(name)


def test_peak_flops_by_device_kind():
    assert accelerators.peak_flops_per_device("TPU v5") == 459e12  # v5p reports itself as "TPU v5"
    assert accelerators.peak_flops_per_device("TPU v5 lite") == 197e12
    assert accelerators.peak_flops_per_device("NVIDIA H100 PCIe") == 989e12
    assert accelerators.peak_flops_per_device("cpu") == 0.0
    assert accelerators.peak_flops_per_device("cpu", 1e12) == 1e12


def test_compile_devices_of_a_tpu_slice_without_a_tpu(capfd):
    devices = accelerators.compile_devices(accelerators.parse_slice("v5e-4"))
    assert len(devices) == 4 and devices[0].device_kind == "TPU v5 lite"
    assert "TPU" not in capfd.readouterr().err  # libtpu's start-up warnings are held back


def test_compile_devices_of_a_gpu_slice_without_a_gpu():
    pytest.importorskip("jax_plugins.xla_cuda12", reason="the CUDA PJRT plugin (extra 'cuda-compile') is absent")
    devices = accelerators.compile_devices(accelerators.parse_slice("h200-8"))
    assert len(devices) == 8 and devices[0].device_kind.startswith("NVIDIA H200")


def _pci(tmp_path, *vendors):
    for i, vendor in enumerate(vendors):
        (tmp_path / f"0000:00:0{i}.0").mkdir()
        (tmp_path / f"0000:00:0{i}.0" / "vendor").write_text(vendor + "\n")
    return str(tmp_path)


@pytest.mark.parametrize("vendors, pinned", [
    (("0x8086", "0x1af4"), True),  # Intel and virtio only: no accelerator
    (("0x8086", "0x1ae0"), False),  # a Google TPU
    (("0x10de",), False),  # an NVIDIA GPU
])
def test_cpu_is_pinned_only_on_hosts_without_accelerators(tmp_path, monkeypatch, vendors, pinned):
    pytest.importorskip("libtpu", reason="pinning applies only where an accelerator plugin is installed")
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    accelerators.pin_cpu_without_accelerators(_pci(tmp_path, *vendors))
    assert os.environ.get("JAX_PLATFORMS") == ("cpu" if pinned else None)


def test_an_explicit_platform_choice_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    accelerators.pin_cpu_without_accelerators(_pci(tmp_path, "0x8086"))
    assert os.environ["JAX_PLATFORMS"] == "tpu"


def test_gpu_targets_name_the_chip():
    assert accelerators.parse_slice("h100-8").target != accelerators.parse_slice("h200-8").target
    assert accelerators.parse_slice("v5p-8").target == "v5p:2x2x1"
