#!/usr/bin/env bash
# Issue 36's verdict matrix on this repository's 2-core machine (2 gloo ranks), each case a
# separate pytest session of docs/benchmarks/cpu/test_verdict_matrix.py (this project's
# pythia-14m from a plain builder, `auto` and `fsdp`, and a user's own loop; every gate at its
# default, REPEATS timed repeats) after RECORDS sessions recorded the baselines on the idle machine:
#   neighbour  unchanged, with a CPU-bound process beside the ranks; all three tests (no failure)
#   wait       every block sleeps, SHARE of the wall time per token; auto   (expected: fails)
#   wait-end   the model sleeps after its forward, SHARE; auto              (expected: fails)
#   compute    a second head, ~30% more FLOPs per token; auto              (expected: fails)
#   slow-rank  rank 1 spins SHARE after its forward, rank 0 waits in the all-reduce after it;
#              test_peers                                               (expected: fails)
#   slow-rank-fsdp  the same under fsdp, rank 0 waits in the all-gathers (expected: fails)
#   collective a 64-byte all-reduce per block; auto                         (expected: fails, work)
#   host-sync  the own loop reads one logit per step (.item()) and waits SHARE (expected: fails)
# Usage: [RECORDS=3] [REPEATS=10] [SHARE=0.2] [CASES="neighbour wait ..."] bash docs/benchmarks/cpu_verdict_matrix.sh OUTDIR [N]
# Measure alone: anything else on the 2 cores moves the figures (the script holds no lock).
set -uo pipefail
out=${1:?output directory}; n=${2:-10}; py=${PYTHON:-python3}; share=${SHARE:-0.2}
cases=${CASES:-neighbour wait wait-end compute slow-rank slow-rank-fsdp collective host-sync}
mkdir -p "$out"
export PYTHONPATH=docs/benchmarks/cpu${PYTHONPATH:+:$PYTHONPATH}
suite=("$py" -m pytest docs/benchmarks/cpu/test_verdict_matrix.py -p no:cacheprovider -q
  --distperf-devices 2 --distperf-accelerator cpu --distperf-repeats "${REPEATS:-10}"
  --distperf-baseline-dir "$out/baselines")
session() {  # session NAME "ENV=VALUE ..." [pytest arguments]
  local name=$1 assignments=$2 t0=$SECONDS; shift 2
  # shellcheck disable=SC2086  # the assignments are words
  env $assignments "${suite[@]}" --distperf-json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s: $(tail -1 "$out/$name.log")"
}
for r in $(seq 1 "${RECORDS:-3}"); do session "record-$r" "" --distperf-update-baselines; done
for case in $cases; do
  if [[ $case == neighbour ]]; then "$py" -c "while True: pass" & neighbour=$!; fi
  for i in $(seq 1 "$n"); do
    case $case in
      neighbour) session "$case-$i" "" ;;
      wait) session "$case-$i" "VERDICT_WAIT_SHARE=$share" -k "builder and auto" ;;
      wait-end) session "$case-$i" "VERDICT_WAIT_END_SHARE=$share" -k "builder and auto" ;;
      compute) session "$case-$i" "VERDICT_EXTRA_HEAD=0.36" -k "builder and auto" ;;
      slow-rank) session "$case-$i" "VERDICT_SLOW_RANK=1:$share" -k peers ;;
      slow-rank-fsdp) session "$case-$i" "VERDICT_SLOW_RANK=1:$share" -k "builder and fsdp" ;;
      collective) session "$case-$i" "VERDICT_ALL_REDUCE=1" -k "builder and auto" ;;
      host-sync) session "$case-$i" "VERDICT_SYNC=1 VERDICT_SYNC_WAIT_SHARE=$share" -k own_loop ;;
      *) echo "unknown case $case" >&2; exit 2 ;;
    esac
  done
  if [[ $case == neighbour ]]; then kill "$neighbour"; wait "$neighbour" 2>/dev/null; fi
done
"$py" docs/benchmarks/verdict_matrix_summary.py "$out"
