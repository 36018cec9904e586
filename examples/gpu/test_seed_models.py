"""The seed issue's models at their real sizes, in bf16: for GPU runners.

    pytest examples/gpu --distperf-devices 2 --distperf-accelerator cuda
    NCCL_P2P_DISABLE=1 pytest examples/gpu ...     # traffic through host memory, PCIe-like

Same workload as ../shared measurements: batch 1, 8-token prompt, 50 new tokens, greedy.
"""

from __future__ import annotations

import pytest

STRATEGIES = ("auto", "ddp", "fsdp", "fsdp2", "fsdp-noreshard")


def _needs_cuda(distperf) -> None:
    if distperf.accelerator != "cuda":
        pytest.skip("seed-size models in bf16 need CUDA ranks (--distperf-accelerator cuda)")


@pytest.mark.strategy(*STRATEGIES)
@pytest.mark.distperf(model="pythia-2.8b", precision="bf16", max_new_tokens=50, prompt_length=8)
def test_pythia_2_8b(distperf):
    _needs_cuda(distperf)
    assert distperf.run().tokens_per_sec > 0


@pytest.mark.strategy("auto", "fsdp", "fsdp-noreshard")
@pytest.mark.distperf(model="llama-2-7b", precision="bf16", max_new_tokens=50, prompt_length=8)
def test_llama_2_7b(distperf):
    _needs_cuda(distperf)
    assert distperf.run().tokens_per_sec > 0
