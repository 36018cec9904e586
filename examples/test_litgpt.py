"""LitGPT's own models under distperf: `litgpt:<config name>` builds LitGPT's `GPT` with random
weights from the seed (no download), in every rank.

    pip install 'pytest-distperf[litgpt]'
    pytest examples/test_litgpt.py --distperf-devices 2

Skipped where LitGPT is not installed. Your own builder returning LitGPT's `GPT` (or any GPT-like
module) works the same way: `distperf(model="package.module:function")` (README).
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("litgpt") is None,
    reason="LitGPT is an optional extra: pip install 'pytest-distperf[litgpt]'",
)


@pytest.mark.strategy("auto", "fsdp-noreshard")
@pytest.mark.distperf(model="litgpt:pythia-14m", max_new_tokens=16)
def test_litgpt_pythia_throughput(distperf):
    result = distperf.run()
    assert result.tokens_per_sec > 0
