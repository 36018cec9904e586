"""A team's own Hugging Face `transformers` model under distperf, as it is: `hf:<config>` builds
`AutoModelForCausalLM` from a config (here `hf_llama/config.json`, beside this file) with random
weights from the seed, no download, in every rank; the built-in loop drives it through its own
static KV cache.

    pip install 'pytest-distperf[hf]'
    pytest examples/test_hf.py --distperf-devices 2

Skipped where transformers is not installed. A builder of your own returning the model works
the same way (`distperf(model="package.module:function")`, README).
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is an optional extra: pip install 'pytest-distperf[hf]'",
)


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="hf:hf_llama", max_new_tokens=16)
def test_hf_llama_throughput(distperf):
    result = distperf.run()
    assert result.tokens_per_sec > 0
