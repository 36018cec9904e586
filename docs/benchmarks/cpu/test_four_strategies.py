"""Issue 24's four-strategy test as a new user writes it: pythia-14m, 12 new tokens, default
options and gates (run by docs/benchmarks/cpu_prediction_table.sh)."""

from __future__ import annotations

import pytest


@pytest.mark.strategy("auto", "fsdp", "tp", "pipeline")
@pytest.mark.distperf(model="pythia-14m", max_new_tokens=12)
def test_four_strategies(distperf):
    distperf.run()
