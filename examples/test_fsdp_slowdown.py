"""The seed issue's shape on any machine: FSDP inference far slower than replicated, and the
no-reshard variant recovering it.

    pytest examples --distperf-devices 2               # CPU ranks with gloo, or all GPUs' worth
    pytest examples --distperf-devices 2 --distperf-accelerator cuda

`cpu-110m` is small enough for CPU CI yet communication-bound under full sharding: every decode
step all-gathers all block weights over loopback. On GPUs, use the seed's own sizes (below).
"""

from __future__ import annotations

import pytest


@pytest.mark.strategy("auto", "fsdp", "fsdp-noreshard")
@pytest.mark.distperf(model="cpu-110m", max_new_tokens=8)
def test_generation_throughput(distperf):
    result = distperf.run()
    assert result.tokens_per_sec > 0


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="pythia-14m", max_new_tokens=16)
def test_small_pythia_throughput(distperf):
    result = distperf.run()
    assert result.tokens_per_sec > 0
