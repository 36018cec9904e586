#!/usr/bin/env bash
# The baseline gate on 1 x H200 with the compiled decode, each session a separate pytest run:
# RECORDS sessions refresh the baseline (as a main branch would), then unchanged sessions and
# sessions with real extra work in every block (slowed_model.py, EXTRA of its bytes; sized to
# slow the decode by about 5%, so named slow5-N) alternate, up to PAIRS of each, until BUDGET
# seconds have passed. Resumable: a later call with the same STATE (kept on
# a warm machine, or carried back) goes on where the last one stopped, its baselines included.
# SEED=dir starts an empty STATE from an earlier run's records and baselines, as a CI branch
# starts from main's; EXTRA is the slowed sessions' extra traffic (a fraction of block bytes).
#   RECORDS=5 PAIRS=10 BUDGET=540 bash docs/benchmarks/gpu/run_gate.sh
set -uo pipefail
STATE=${STATE:-.gate-run}; RECORDS=${RECORDS:-5}; PAIRS=${PAIRS:-10}; BUDGET=${BUDGET:-540}
OUT=${OUT:-/tmp/distperf-gate}; SEED=${SEED:-}; EXTRA=${EXTRA:-0.03}
mkdir -p "$STATE" "$OUT"
python3 -c "import sys; sys.exit(not 0 < float(sys.argv[1]) < 1)" "$EXTRA" 2>/dev/null \
  || { echo "EXTRA=$EXTRA: a fraction in (0, 1) of each block's bytes" >&2; exit 2; }
if [[ -n $SEED && ! -d $STATE/baselines ]]; then
  if [[ ! -d $SEED/baselines ]] || ! compgen -G "$SEED/record-*.json" >/dev/null; then
    echo "SEED=$SEED: no baselines/ and record-*.json to start from" >&2; exit 2
  fi
  cp -r "$SEED/baselines" "$SEED"/record-*.json "$STATE/" || exit 1
fi
# inductor's cache beside the state: a session after the first compiles from it.
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$(cd "$STATE" && pwd)/inductor
export PYTHONPATH=docs/benchmarks/gpu${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
base=(-p no:cacheprovider -q docs/benchmarks/gpu/test_gate.py --distperf-devices 1
      --distperf-accelerator cuda --distperf-baseline-dir "$STATE/baselines" --distperf-timeout 500)
start=$SECONDS
session() { local name=$1; shift; local t0=$SECONDS
  python3 -m pytest "${base[@]}" --distperf-json "$STATE/$name.json" "$@" > "$STATE/$name.log" 2>&1
  local rc=$?
  [[ -s "$STATE/$name.json" ]] || { tail -40 "$STATE/$name.log"; finish 1; }  # broken: stop here
  python3 - "$STATE/$name.json" "$name" "$rc" "$((SECONDS - t0))" <<'PY'
import json, sys
path, name, rc, secs = sys.argv[1:]
try:
    r = json.load(open(path))["results"][0]
except Exception as e:
    print(f"{name:10} rc={rc} {secs}s no result ({e})"); raise SystemExit
def f(key, digits=3):
    v = r.get(key)
    return v if not isinstance(v, float) else round(v, digits)
print(f"{name:9} rc={rc} {secs:>3}s tok/s {r['tokens_per_sec']:7.2f} decode {r['decode_tokens_per_sec']:7.2f} "
      f"bw {f('bandwidth_utilization')} change {f('change', 4)} tol {f('tolerance', 4)} "
      f"detect {f('detectable_drop', 4)} compile_s {f('compile_s', 1)} verdict {r['verdict']}")
PY
}
finish() { tar czf "$OUT/gate.tgz" --exclude inductor -C "$STATE" .; exit "${1:-0}"; }
count() { ls "$STATE"/"$1"-*.json 2>/dev/null | wc -l; }
while (( $(count record) < RECORDS && SECONDS - start < BUDGET )); do
  session "record-$(( $(count record) + 1 ))" --distperf-update-baselines
done
while (( $(count slow5) < PAIRS && SECONDS - start < BUDGET )); do
  if (( $(count same) <= $(count slow5) )); then
    session "same-$(( $(count same) + 1 ))"
  else
    DISTPERF_EXTRA_WORK=$EXTRA session "slow5-$(( $(count slow5) + 1 ))"
  fi
done
# The device tool brings back few files: one archive of the runs (not the compile cache).
finish
