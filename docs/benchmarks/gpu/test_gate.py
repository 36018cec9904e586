"""The gate's sharpness where the decode is device-bound: llama-2-7b shape, bf16, compiled."""

import pytest


@pytest.mark.distperf(
    model="slowed_model:build", precision="bf16", max_new_tokens=50, prompt_length=8, compile=True
)
def test_llama_2_7b_compiled(distperf):
    assert distperf.run().tokens_per_sec > 0
