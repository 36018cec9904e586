"""The session cpu_work_targets.sh repeats: a LitGPT model from a plain builder, replicated and
fully sharded, on 2 CPU ranks, every gate at its default."""

import pytest


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="work_models:pythia", max_new_tokens=16)
def test_builder(distperf):
    distperf.run()
