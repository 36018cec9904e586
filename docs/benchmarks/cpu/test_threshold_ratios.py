"""Healthy runs whose threshold is judged on 2 CPU ranks, for their ratio to the prediction
over unchanged sessions (docs/benchmarks/cpu_threshold_ratios.sh): LitGPT's pythia-14m and
the example's small HF Llama (examples/hf_llama), decode and training."""

import pytest

HF = "hf:../../../examples/hf_llama"


@pytest.mark.strategy("fsdp", "tp", "pipeline")
@pytest.mark.distperf(model="pythia-14m", max_new_tokens=8)
def test_decode(distperf):
    distperf.run()


@pytest.mark.strategy("fsdp", "tp", "pipeline")
@pytest.mark.distperf(model=HF, max_new_tokens=8, batch_size=2)
def test_hf_decode(distperf):
    distperf.run()


@pytest.mark.strategy("auto", "fsdp", "tp")
@pytest.mark.distperf(model="pythia-14m", mode="train", seq_length=16, batch_size=2)
def test_train(distperf):
    distperf.run()


@pytest.mark.strategy("fsdp", "tp")
@pytest.mark.distperf(model=HF, mode="train", seq_length=16, batch_size=2)
def test_hf_train(distperf):
    distperf.run()
