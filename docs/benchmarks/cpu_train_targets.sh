#!/usr/bin/env bash
# Issue 25's CPU targets on this repository's 2-core machine (2 gloo ranks), each a separate
# pytest session of docs/benchmarks/cpu/test_train_targets.py (every strategy that trains,
# default gates, 15 timed steps):
#   1. one session records the baselines;
#   2. N unchanged sessions (no failure expected; measured/predicted of each run);
#   3. N sessions with every step slowed by 30% (DISTPERF_SLOWDOWN=0.3): the baseline must fail.
# Usage: bash docs/benchmarks/cpu_train_targets.sh OUTDIR [N]
# Summary: python3 docs/benchmarks/cpu/train_targets_summary.py OUTDIR
set -uo pipefail
out=${1:?output directory}; n=${2:-3}; py=${PYTHON:-python3}
mkdir -p "$out"
suite=("$py" -m pytest docs/benchmarks/cpu/test_train_targets.py -p no:cacheprovider -q
  --distperf-devices 2 --distperf-accelerator cpu --distperf-repeats 15
  --distperf-baseline-dir "$out/baselines")
session() {  # session NAME "ENV=VALUE ..." [pytest arguments]
  local name=$1 assignments=$2; shift 2
  # shellcheck disable=SC2086  # the assignments are words
  env $assignments "${suite[@]}" --distperf-json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 "$out/$name.log")"
}
session record "" --distperf-update-baselines
for i in $(seq 1 "$n"); do session "same-$i" ""; done
for i in $(seq 1 "$n"); do session "slowed-$i" "DISTPERF_SLOWDOWN=0.3"; done
