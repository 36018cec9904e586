"""Issue 25's CPU targets: every strategy that trains, pythia-14m, 2 gloo ranks, default gates
(docs/benchmarks/cpu_train_targets.sh runs it)."""

import pytest


@pytest.mark.strategy("auto", "ddp", "fsdp", "fsdp2", "fsdp-noreshard", "tp")
@pytest.mark.distperf(model="pythia-14m", mode="train", seq_length=64, batch_size=2)
def test_train_step(distperf):
    distperf.run()
