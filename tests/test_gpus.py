"""Counting the CUDA devices torch would see, without importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_distperf.topology import gpus

UUIDS = [f"GPU-{i}aaaaaaa-0000-0000-0000-00000000000{i}" for i in range(4)]


@pytest.fixture
def cuda_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "torch_has_cuda", lambda: True)
    monkeypatch.setattr(gpus, "_torch_count", _torch_must_not_be_asked)


def _torch_must_not_be_asked() -> int:
    raise AssertionError("torch was asked although NVML answered")


@pytest.mark.parametrize(
    ("env", "count"), [(None, 4), ("", 0), ("2,0", 2), ("1,7,2", 1), ("-1", 0), ("GPU-3", 1)]
)
def test_nvml_count_follows_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, cuda_torch: None, env: str | None, count: int
) -> None:
    monkeypatch.setattr(gpus, "_nvml_uuids", lambda: UUIDS)
    environ = {} if env is None else {"CUDA_VISIBLE_DEVICES": env}
    assert gpus.visible_gpus(environ) == count


def test_no_driver_at_all_is_zero_without_torch(
    monkeypatch: pytest.MonkeyPatch, cuda_torch: None
) -> None:
    monkeypatch.setattr(gpus, "_nvml_uuids", lambda: None)
    assert gpus.visible_gpus({}) == 0


def test_torch_answers_when_nvml_fails_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[str]:
        raise RuntimeError("driver/library version mismatch")

    monkeypatch.setattr(gpus, "torch_has_cuda", lambda: True)
    monkeypatch.setattr(gpus, "_nvml_uuids", broken)
    monkeypatch.setattr(gpus, "_torch_count", lambda: 3)
    assert gpus.visible_gpus({}) == 3
    # A MIG slice has no UUID NVML lists here: torch counts it.
    monkeypatch.setattr(gpus, "_nvml_uuids", lambda: UUIDS)
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "MIG-1111"}) == 3


def test_cpu_only_torch_sees_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "torch_has_cuda", lambda: False)
    monkeypatch.setattr(gpus, "_nvml_uuids", lambda: UUIDS)
    assert gpus.visible_gpus({}) == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", False),
        ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", True),
        ("cuda = None\nhip = '6.2.4'\n", True),
        ("__version__ = '2.13.0'\n", True),  # cannot tell: torch decides later
    ],
)
def test_torch_build_is_read_from_its_version_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, expected: bool
) -> None:
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "version.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch")  # find_spec would answer from the loaded one
    assert gpus.torch_has_cuda() is expected


def test_this_torch_agrees_with_its_own_count() -> None:
    import torch

    # A fresh interpreter counts without torch; this one (same environment) asks torch.
    code = (
        "import sys; from pytest_distperf.topology.gpus import visible_gpus; n = visible_gpus(); "
        "print(n, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    counted, loaded = out.stdout.split()
    assert int(counted) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert loaded == "False"  # NVML or the version file answered
