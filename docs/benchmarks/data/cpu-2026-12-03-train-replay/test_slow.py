import pytest


@pytest.mark.strategy("auto", "fsdp", "fsdp-noreshard", "tp")
@pytest.mark.distperf(model="pythia-14m", mode="train", seq_length=16, batch_size=2)
def test_train(distperf):
    distperf.run()
