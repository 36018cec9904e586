"""tp and pipeline on one rank: no traffic, so they should equal auto within noise."""

import pytest


@pytest.mark.strategy("auto", "tp", "pipeline")
@pytest.mark.distperf(model="pythia-1b", precision="bf16", max_new_tokens=50)
def test_one_rank(distperf):
    assert distperf.run().tokens_per_sec > 0
