#!/usr/bin/env bash
# Training steps under the baseline gate on one H200: pythia-1b bf16-mixed, `auto` and `fsdp`
# eager, 10 timed steps: record, an unchanged session, then every step slowed by 30%.
# Run from the repository root on the GPU machine:  bash docs/benchmarks/gpu/run_train_gate.sh
set -uo pipefail
OUT=${OUT:-/tmp/distperf-train-gate}
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1
SUITE=$(mktemp -d)
cat > "$SUITE/test_train_gate.py" <<'PY'
import pytest


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="pythia-1b", mode="train", precision="bf16-mixed", seq_length=2048,
                      batch_size=4)
def test_train_gate(distperf):
    distperf.run()
PY
cd "$SUITE"
run() {  # run NAME [pytest arguments]
  local name=$1; shift
  python3 -m pytest -p no:cacheprovider test_train_gate.py --distperf-devices=1 \
    --distperf-repeats=10 --distperf-baseline-dir="$OUT/baselines" \
    --distperf-json="$OUT/$name.json" -q "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? $(tail -1 "$OUT/$name.txt")"
}
run record --distperf-update-baselines
run same
DISTPERF_SLOWDOWN=0.3 run slowed
