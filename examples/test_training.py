"""Training steps under the same gates: `mode="train"` times optimizer steps (forward, next-token
cross-entropy, backward, AdamW) instead of generations, and checks each strategy's first loss
against one process's on the same weights and batch (docs/training.md). FSDP's step also
gathers every block's weights and reduce-scatters its gradients; its prediction, and so its
threshold, counts both.

    pytest examples/test_training.py --distperf-devices 2 --distperf-accelerator cpu

pythia-14m keeps a CPU step at a fraction of a second; on GPUs, use a 1B-class model in
`precision="bf16-mixed"` (README, "Training steps").
"""

from __future__ import annotations

import pytest


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="pythia-14m", mode="train", seq_length=32, batch_size=2)
def test_training_step(distperf):
    result = distperf.run()
    assert result.loss == pytest.approx(result.reference_loss, rel=1e-4)
