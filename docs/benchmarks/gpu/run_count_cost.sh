#!/usr/bin/env bash
# What counting the work costs a 1 x H200 test: llama-2-7b bf16, `auto` and `fsdp`, eager; the
# JSON's count_s is the counted generation's own time, work_s the rank's whole test.
#   bash docs/benchmarks/gpu/run_count_cost.sh          # writes under $OUT
set -uo pipefail
OUT=${OUT:-/tmp/distperf-count-cost}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pytest -p no:cacheprovider -q examples/gpu/test_seed_models.py \
  -k "llama and (auto or fsdp-1cuda)" --distperf-devices 1 --distperf-accelerator cuda \
  --distperf-json "$OUT/gpu-count.json" > "$OUT/gpu-count.log" 2>&1
echo "rc=$?"; tail -n 12 "$OUT/gpu-count.log"
python3 - "$OUT/gpu-count.json" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["results"]:
    print(row["test_id"], "count_s", row["count_s"], "work_s", row["work_s"], "tok/s", row["tokens_per_sec"])
PY
