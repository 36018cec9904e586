"""How many CUDA devices torch would see, counted without importing torch (seconds at collection):
NVML, then torch only where NVML fails with a driver there (a MIG slice)."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path

from pytest_distperf.topology.nvml import as_text, resolve_visible_devices


def visible_gpus(environ: Mapping[str, str] = os.environ) -> int:
    """CUDA devices torch would count here (0 with a CPU-only torch build)."""
    if not torch_has_cuda():
        return 0
    try:  # ValueError for a MIG slice
        uuids = _nvml_uuids()
        if uuids is None:  # no driver: no NVIDIA GPU can be in use
            return 0
        return len(resolve_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"), uuids)[0])
    except Exception:  # noqa: BLE001 - any other trouble: let torch answer
        return _torch_count()


def _nvml_uuids() -> list[str] | None:
    """The GPUs' UUIDs in NVML's (PCI) order; None where NVML's library is not installed."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return [as_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in handles]
    finally:
        pynvml.nvmlShutdown()


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
