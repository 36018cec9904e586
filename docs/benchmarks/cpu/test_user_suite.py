"""Issue 45's user suite (cpu_unchanged_reruns.sh): a LitGPT pythia-14m builder, `auto` and
`fsdp`, every gate at its default."""

import pytest


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="litgpt_user:pythia", max_new_tokens=16)
def test_user_suite(distperf):
    distperf.run()
