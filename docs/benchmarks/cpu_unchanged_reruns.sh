#!/usr/bin/env bash
# Issue 45's target on 2 CPU ranks, 3 repeats, every gate at its default: the user suite
# (cpu/test_user_suite.py) records once, then N unchanged sessions; a gross regression (every
# attention call waits, GROSS of the wall time) after that one record; two more records; N
# unchanged sessions; then a smaller regression (SHARE) and the gross one again.
# Measure alone: anything else on the 2 cores moves the figures.
#   [N=10] [SHARE=0.3] [GROSS=0.7] bash docs/benchmarks/cpu_unchanged_reruns.sh OUTDIR
set -uo pipefail
out=${1:?output directory}; n=${N:-10}; py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=docs/benchmarks/cpu${PYTHONPATH:+:$PYTHONPATH}
suite=("$py" -m pytest docs/benchmarks/cpu/test_user_suite.py -p no:cacheprovider -q
  --distperf-devices 2 --distperf-accelerator cpu --distperf-repeats 3
  --distperf-baseline-dir "$out/baselines")
session() {  # session NAME "ENV=VALUE ..." [pytest arguments]
  local name=$1 assignments=$2 t0=$SECONDS; shift 2
  # shellcheck disable=SC2086  # the assignments are words
  env $assignments "${suite[@]}" --distperf-json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s: $(tail -1 "$out/$name.log")"
}
session record-1 "" --distperf-update-baselines
for i in $(seq 1 "$n"); do session "after1-same-$i" ""; done
session after1-gross "USER_WAIT_SHARE=${GROSS:-0.7}" -k auto
session record-2 "" --distperf-update-baselines
session record-3 "" --distperf-update-baselines
for i in $(seq 1 "$n"); do session "after3-same-$i" ""; done
session after3-moderate "USER_WAIT_SHARE=${SHARE:-0.3}" -k auto
session after3-gross "USER_WAIT_SHARE=${GROSS:-0.7}" -k auto
"$py" docs/benchmarks/unchanged_reruns_summary.py "$out" | tee "$out/summary.md"
