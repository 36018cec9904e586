"""How many CUDA devices torch would see, counted without importing torch (seconds at collection):
NVML, then `nvidia-smi -L`, then torch only where both fail with a driver (a MIG slice)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from pytest_distperf.topology.cuda import as_text, resolve_visible_devices
from pytest_distperf.topology.smi import run_nvidia_smi

_SMI_GPU_LINE = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)", re.MULTILINE)


class NoDriver(Exception):
    """Neither NVML's library nor `nvidia-smi` exists here: no NVIDIA GPU can be in use."""


def visible_gpus(environ: Mapping[str, str] = os.environ) -> int:
    """CUDA devices torch would count here (0 with a CPU-only torch build)."""
    if not torch_has_cuda():
        return 0
    failures = 0
    for uuids in (_nvml_uuids, _smi_uuids):
        try:  # ValueError for a MIG slice
            return len(resolve_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"), uuids())[0])
        except NoDriver:
            continue
        except Exception:  # noqa: BLE001 - any other trouble: let torch answer
            failures += 1
    return _torch_count() if failures else 0


def _nvml_uuids() -> list[str]:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise NoDriver from None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return [as_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in handles]
    finally:
        pynvml.nvmlShutdown()


def _smi_uuids() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise NoDriver
    return parse_nvidia_smi_l(run_nvidia_smi(exe, "-L"))


def parse_nvidia_smi_l(text: str) -> list[str]:
    """The GPUs' UUIDs from `nvidia-smi -L`, in its (PCI) order; MIG lines are left out."""
    return _SMI_GPU_LINE.findall(text)


def _torch_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA (or ROCm) build, read from its version file; True
    when that cannot be told (torch decides when the ranks start)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return True
    for location in spec.submodule_search_locations:
        try:
            text = (Path(location) / "version.py").read_text()
        except OSError:
            continue
        builds = re.findall(r"^(cuda|hip)\b[^=\n]*=\s*(.+)$", text, re.MULTILINE)
        if builds:
            return any(value.strip() != "None" for _, value in builds)
    return True
