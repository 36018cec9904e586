#!/usr/bin/env bash
# Training mode on one H200: pythia-1b, bf16-mixed, every strategy that runs on one device
# (eager), and the replicated one compiled. Writes report JSON and the terminal output to $OUT.
# Run from the repository root on the GPU machine:  bash docs/benchmarks/gpu/run_train.sh
set -euo pipefail
OUT=${OUT:-/tmp/distperf-train}
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, 'cuda', torch.version.cuda)" > "$OUT/versions.txt"
SUITE=$(mktemp -d)
cat > "$SUITE/test_train_h200.py" <<'PY'
import pytest

TRAIN = dict(model="pythia-1b", mode="train", precision="bf16-mixed", seq_length=2048,
             batch_size=int(__import__("os").environ.get("TRAIN_BATCH", "4")))


@pytest.mark.strategy("auto", "ddp", "fsdp", "fsdp2", "fsdp-noreshard", "tp")
@pytest.mark.distperf(**TRAIN)
def test_train_eager(distperf):
    distperf.run()


@pytest.mark.strategy("auto")
@pytest.mark.distperf(**TRAIN, compile=True)
def test_train_compiled(distperf):
    distperf.run()
PY
cd "$SUITE"
python3 -m pytest -p no:cacheprovider test_train_h200.py --distperf-devices=1 \
  --distperf-json="$OUT/train-report.json" -q 2>&1 | tee "$OUT/train-session.txt" | tail -40
