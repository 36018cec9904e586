#!/usr/bin/env bash
# The baseline gate on 1 x H200 with the compiled decode: RECORDS sessions refresh the baseline
# (as a main branch would), then unchanged sessions and sessions with 5% real extra work in
# every block (slowed_model.py) alternate until BUDGET seconds have passed.
#   RECORDS=3 BUDGET=480 bash docs/benchmarks/gpu/run_gate.sh
set -uo pipefail
OUT=${OUT:-/tmp/distperf-gate}; RECORDS=${RECORDS:-3}; BUDGET=${BUDGET:-480}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=docs/benchmarks/gpu${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
base=(-p no:cacheprovider -q docs/benchmarks/gpu/test_gate.py --distperf-devices 1
      --distperf-accelerator cuda --distperf-baseline-dir "$OUT/baselines" --distperf-timeout 400)
session() { local name=$1; shift; local t0=$SECONDS
  python3 -m pytest "${base[@]}" --distperf-json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  python3 - "$OUT/$name.json" "$name" "$rc" "$((SECONDS - t0))" <<'PY'
import json, sys
path, name, rc, secs = sys.argv[1:]
try:
    r = json.load(open(path))["results"][0]
except Exception as e:
    print(f"{name:10} rc={rc} {secs}s no result ({e})"); raise SystemExit
bw = r.get("bandwidth_utilization")
print(f"{name:10} rc={rc} {secs:>4}s tok/s {r['tokens_per_sec']:8.2f} decode {r['decode_tokens_per_sec']:8.2f} "
      f"bw {bw if bw is None else round(bw, 3)} change {r.get('change')} tol {r.get('tolerance')} "
      f"detect {r.get('detectable_drop')} compile_s {r.get('compile_s') and round(r['compile_s'], 1)} "
      f"verdict {r['verdict']}")
PY
}
start=$SECONDS
for i in $(seq 1 "$RECORDS"); do session "record-$i" --distperf-update-baselines; done
i=1
while (( SECONDS - start < BUDGET )); do
  session "same-$i"
  (( SECONDS - start < BUDGET )) || break
  DISTPERF_EXTRA_WORK=0.05 session "slow5-$i"
  i=$((i + 1))
done
cp -r "$OUT/baselines" "$OUT/baselines-final" 2>/dev/null
# The device tool brings back few files: one archive of everything.
tar czf /tmp/gate.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/gate.tgz "$OUT/"
