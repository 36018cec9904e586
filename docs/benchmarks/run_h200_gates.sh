#!/usr/bin/env bash
# Baseline gate on a CUDA machine: record baselines for the example suite's small test, rerun it
# unchanged N times, then with the slow-down knob at 10%. Logs and JSON go to $OUT.
#   bash docs/benchmarks/run_h200_gates.sh [RERUNS]
set -uo pipefail
reruns=${1:-10}
OUT=${OUT:-/tmp/distperf-gates}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
base=(python3 -m pytest examples/test_fsdp_slowdown.py -k small -p no:cacheprovider -q
  --distperf-devices 2 --distperf-accelerator cuda --distperf-baseline-dir "$OUT/baselines"
  --distperf-efficiency 0.3)
"${base[@]}" --distperf-update-baselines --distperf-json "$OUT/record.json" > "$OUT/record.log" 2>&1
echo "record: rc=$?"
for i in $(seq 1 "$reruns"); do
  "${base[@]}" --distperf-json "$OUT/rerun-$i.json" > "$OUT/rerun-$i.log" 2>&1
  echo "rerun $i: rc=$? $(tail -1 "$OUT/rerun-$i.log")"
done
DISTPERF_SLOWDOWN=0.1 "${base[@]}" --distperf-json "$OUT/slow10.json" > "$OUT/slow10.log" 2>&1
echo "slowdown 10%: rc=$? $(tail -1 "$OUT/slow10.log")"
grep -h "throughput\|detectable" "$OUT/slow10.log" | head -4
# one archive: the device tool brings back only a few files
tar czf "$OUT/gates.tgz" -C "$OUT" $(cd "$OUT" && ls *.log *.json) baselines \
  && (cd "$OUT" && rm -rf ./*.log ./*.json baselines)
