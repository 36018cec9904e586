#!/usr/bin/env bash
# Issue 23's targets on this repository's 2-core machine (2 gloo ranks), each a separate pytest
# session of docs/benchmarks/cpu/test_work_targets.py (LitGPT pythia-14m from a plain builder,
# `auto` and `fsdp`, every gate at its default):
#   1. RECORDS sessions record the baselines on the idle machine;
#   2. N unchanged sessions with a CPU-bound process beside the ranks (no failure expected);
#   3. N sessions, neighbour still running, of the model with WORK_EXTRA_HEAD (extra computation);
#   4. N sessions on the idle machine of the model with WORK_ALL_REDUCE=1 (64 bytes per block).
# Usage: [RECORDS=1] [EXTRA_HEAD=0.4] bash docs/benchmarks/cpu_work_targets.sh OUTDIR [N]
set -uo pipefail
out=${1:?output directory}; n=${2:-10}; py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH=docs/benchmarks/cpu${PYTHONPATH:+:$PYTHONPATH}
suite=("$py" -m pytest docs/benchmarks/cpu/test_work_targets.py -p no:cacheprovider -q
  --distperf-devices 2 --distperf-accelerator cpu --distperf-baseline-dir "$out/baselines")
session() {  # session NAME "ENV=VALUE ..." [pytest arguments]
  local name=$1 assignments=$2; shift 2
  # shellcheck disable=SC2086  # the assignments are words
  env $assignments "${suite[@]}" --distperf-json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 "$out/$name.log")"
}
for r in $(seq 1 "${RECORDS:-1}"); do session "record-$r" "" --distperf-update-baselines; done
"$py" -c "while True: pass" & neighbour=$!
trap 'kill $neighbour 2>/dev/null' EXIT
for i in $(seq 1 "$n"); do session "busy-same-$i" ""; done
for i in $(seq 1 "$n"); do session "busy-extra-head-$i" "WORK_EXTRA_HEAD=${EXTRA_HEAD:-0.4}"; done
kill $neighbour; wait $neighbour 2>/dev/null
for i in $(seq 1 "$n"); do session "all-reduce-$i" "WORK_ALL_REDUCE=1"; done
