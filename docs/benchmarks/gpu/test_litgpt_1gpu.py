"""LitGPT's own GPT (pythia-1b shape, random weights, bf16) beside the reference model's."""

import pytest


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="litgpt:pythia-1b", precision="bf16", max_new_tokens=50)
def test_litgpt_pythia_1b(distperf):
    assert distperf.run().tokens_per_sec > 0


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="pythia-1b", precision="bf16", max_new_tokens=50)
def test_reference_pythia_1b(distperf):
    assert distperf.run().tokens_per_sec > 0
