#!/usr/bin/env bash
# CPU acceptance of the gates on this repository's 2-core machine (2 gloo ranks):
#   1. record baselines for the example suite (RECORDS times, default 1: each refresh adds its
#      run median to the entries' history, from which the gate learns the drift between runs);
#   2. the suite with the slow-down knob at 50%: the threshold must fail (issue 3);
#   3. the suite unchanged N times: no failure; with the knob at 30% N times: all fail (issue 4).
# Usage: [RECORDS=3] bash docs/benchmarks/cpu_acceptance.sh OUTDIR [N]
set -uo pipefail
out=${1:?output directory}
n=${2:-20}
mkdir -p "$out"
py=${PYTHON:-python3}
suite=("$py" -m pytest examples/test_fsdp_slowdown.py -p no:cacheprovider -q
  --distperf-devices 2 --distperf-accelerator cpu --distperf-baseline-dir "$out/baselines")
for r in $(seq 1 "${RECORDS:-1}"); do
  "${suite[@]}" --distperf-update-baselines --distperf-json "$out/record-$r.json" > "$out/record-$r.log" 2>&1
  echo "record $r rc=$? $(tail -1 "$out/record-$r.log")"
done
DISTPERF_SLOWDOWN=0.5 "${suite[@]}" --distperf-json "$out/slow50.json" > "$out/slow50.log" 2>&1
echo "slowdown 50% rc=$? $(tail -1 "$out/slow50.log")"
for i in $(seq 1 "$n"); do
  "${suite[@]}" --distperf-json "$out/same-$i.json" > "$out/same-$i.log" 2>&1
  echo "unchanged $i rc=$? $(tail -1 "$out/same-$i.log")"
done
for i in $(seq 1 "$n"); do
  DISTPERF_SLOWDOWN=0.3 "${suite[@]}" --distperf-json "$out/slow30-$i.json" > "$out/slow30-$i.log" 2>&1
  echo "slowdown 30% $i rc=$? $(tail -1 "$out/slow30-$i.log")"
done
