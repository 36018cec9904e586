import pytest


@pytest.mark.strategy("auto", "fsdp", "tp")
@pytest.mark.distperf(model="pythia-14m", max_new_tokens=12, compile=True)
def test_c14(distperf):
    result = distperf.run()
    assert result.tokens_per_sec > 0
