"""The device kinds' records (pytest_distperf/platform.py): looked up by name, pure."""

from __future__ import annotations

import pytest

from pytest_distperf.platform import CPU, CUDA, PLATFORMS, fsdp_runs, platform_of
from pytest_distperf.strategies.fsdp import fsdp_is_fsdp1


def test_each_kind_is_looked_up_by_its_accelerator_name() -> None:
    assert platform_of("cpu") is CPU and platform_of("cuda") is CUDA
    assert set(PLATFORMS) == {"cpu", "cuda"}
    with pytest.raises(ValueError, match="no platform 'rocm'; known: cpu, cuda"):
        platform_of("rocm")


def test_what_fsdp_runs_is_the_records_and_fsdp2_where_none_is_known() -> None:
    assert [fsdp_runs(name) for name in ("cpu", "cuda", "unknown")] == ["FSDP2", "FSDP1", "FSDP2"]
    assert [fsdp_is_fsdp1(name) for name in ("cpu", "cuda", "unknown")] == [False, True, False]


def test_the_records_policy_where_the_branches_had_it() -> None:
    assert (CPU.backend, CUDA.backend) == ("gloo", "nccl")
    assert CPU.shares_cores and not CPU.allocator_memory and not CPU.queues_kernels
    assert CUDA.gpus and CUDA.allocator_memory and CUDA.queues_kernels and not CUDA.shares_cores
