"""The session the verdict matrix repeats (cpu_verdict_matrix.sh, tests/test_verdict_matrix.py):
this project's pythia-14m from a plain builder, replicated and fully sharded, a user's own
generate loop, and a replicated model whose ranks all-reduce after every forward (so that a
slower rank makes its peer wait), on 2 CPU ranks, every gate at its default."""

import pytest


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="verdict_models:pythia", max_new_tokens=16)
def test_builder(distperf):
    distperf.run()


@pytest.mark.distperf(
    model="verdict_models:pythia", generate="verdict_models:greedy", max_new_tokens=16
)
def test_own_loop(distperf):
    distperf.run()


@pytest.mark.distperf(model="verdict_models:peers", max_new_tokens=16)
def test_peers(distperf):
    distperf.run()
