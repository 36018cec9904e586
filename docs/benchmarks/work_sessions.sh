#!/usr/bin/env bash
# Issue 23's exactness target: unchanged sessions of the example suite on 2 CPU ranks give the
# same counted work every time and no work-gate failure. The first session records the
# baselines; the others compare with them, PARALLEL at a time, each pinned to its own 2 cores
# (taskset) so that sessions do not share a core. Work is counted, not timed: the timing gates
# of sessions that ran side by side are reported but are not what this measures.
# No wave starts after BUDGET seconds (a device call has a time limit); a later call goes on
# with START=<next number> BASELINES=<the first session's baselines folder>.
#   SESSIONS=20 PARALLEL=8 bash docs/benchmarks/work_sessions.sh      # writes under $OUT
#   PYTEST_ADDOPTS="-k 'not litgpt'" ...                              # where LitGPT is absent
set -uo pipefail
SESSIONS=${SESSIONS:-20}; PARALLEL=${PARALLEL:-1}; OUT=${OUT:-/tmp/distperf-work-sessions}
PYTHON=${PYTHON:-python3}; BUDGET=${BUDGET:-100000}; START=${START:-1}; BASELINES=${BASELINES:-}
mkdir -p "$OUT/sessions"
[[ -n $BASELINES ]] && cp -r "$BASELINES" "$OUT/baselines"
export PYTHONUNBUFFERED=1
base=(-m pytest -p no:cacheprovider -q examples --distperf-devices 2 --distperf-accelerator cpu
      --distperf-baseline-dir "$OUT/baselines" --distperf-timeout 500)
session() {  # session NUMBER CORES [extra pytest arguments]
  local n=$1 cores=$2; shift 2; local t0=$SECONDS
  taskset -c "$cores" "$PYTHON" "${base[@]}" --distperf-json "$OUT/sessions/$n.json" "$@" \
    > "$OUT/sessions/$n.log" 2>&1
  echo "session $n (cores $cores) rc=$? $((SECONDS - t0)) s"
}
n=$START
if [[ -z $BASELINES ]]; then session "$n" 0,1 --distperf-update-baselines; n=$((n + 1)); fi
while (( n <= SESSIONS && SECONDS < BUDGET )); do
  for (( slot = 0; slot < PARALLEL && n <= SESSIONS; slot++, n++ )); do
    session "$n" "$((2 * slot)),$((2 * slot + 1))" &
  done
  wait
done
"$PYTHON" docs/benchmarks/work_sessions_summary.py "$OUT/sessions" > "$OUT/summary.json"
tail -n 30 "$OUT/summary.json"
tar -czf "$OUT/sessions.tar.gz" -C "$OUT" sessions baselines
