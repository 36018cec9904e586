"""Issue 44 on one GPU: LitGPT pythia-410m, bf16, eager, `auto`, 64 new tokens, the built-in
loop and a user's own loop (run_syncs.sh regresses each by an environment variable)."""

import pytest


@pytest.mark.distperf(model="sync_models:litgpt_pythia", precision="bf16", max_new_tokens=64)
def test_builder(distperf):
    distperf.run()


@pytest.mark.distperf(
    model="sync_models:litgpt_pythia",
    generate="verdict_models:greedy",
    precision="bf16",
    max_new_tokens=64,
)
def test_own_loop(distperf):
    distperf.run()
