#!/usr/bin/env bash
# Issue 24's CPU rows: measured/predicted of every strategy of the example suite (the README's
# main job) and of the four-strategy pythia-14m test, N unchanged sessions each, 2 CPU ranks.
# Usage: bash docs/benchmarks/cpu_prediction_table.sh OUTDIR [N]
# Summary: python3 docs/benchmarks/prediction_table.py OUTDIR/*.json
set -uo pipefail
out=${1:?output directory}; n=${2:-3}; py=${PYTHON:-python3}
mkdir -p "$out"
ranks=(--distperf-devices 2 --distperf-accelerator cpu -p no:cacheprovider -q)
for i in $(seq 1 "$n"); do
  "$py" -m pytest examples "${ranks[@]}" --distperf-json "$out/examples-$i.json" \
    > "$out/examples-$i.log" 2>&1
  echo "examples-$i rc=$? $(tail -1 "$out/examples-$i.log")"
  "$py" -m pytest docs/benchmarks/cpu/test_four_strategies.py "${ranks[@]}" \
    --distperf-json "$out/four-$i.json" > "$out/four-$i.log" 2>&1
  echo "four-$i rc=$? $(tail -1 "$out/four-$i.log")"
done
