#!/usr/bin/env bash
# Host syncs per counted step over unchanged sessions on one CUDA device (carry .whl): the
# training file and the generation test, session 1 records, sessions 2-6 rerun unchanged.
#   bash docs/benchmarks/gpu/run_sync_sessions.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
B=/tmp/sb; rm -rf $B
for i in 1 2 3 4 5 6; do
  extra=(); [[ $i == 1 ]] && extra=(--distperf-update-baselines)
  timeout 60 python3 -m pytest examples/test_training.py examples/test_fsdp_slowdown.py -k "training or generation_throughput" -q -p no:cacheprovider \
    --distperf-devices 1 --distperf-accelerator cuda --distperf-baseline-dir $B --distperf-json /tmp/s$i.json "${extra[@]}" > /tmp/s$i.log 2>&1
  echo "== session $i rc=$? $(tail -1 /tmp/s$i.log)"
  python3 - "$i" <<'PY'
import json, sys
d = json.load(open(f"/tmp/s{sys.argv[1]}.json"))
for r in d["results"]:
    w = r.get("work") or {}
    syncs = {ph: (v or {}).get("syncs") for ph, v in w.items() if isinstance(v, dict)}
    print("  ", r["test_id"].split("::")[1], r["verdict"], syncs)
PY
done
