#!/usr/bin/env bash
# Issue 44 on one CUDA device (carry .whl: litgpt 0.5.13, jsonargparse and its needs): one
# session records the baselines, three unchanged sessions follow, then LitGPT's model with a
# sync per block and the own loop with `.item()` per token; then the count's cost.
#   OUT=/tmp/s bash docs/benchmarks/gpu/run_syncs.sh
set -uo pipefail
OUT=${OUT:-/tmp/distperf-syncs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=docs/benchmarks/gpu:docs/benchmarks/cpu
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,serial,driver_version,memory.total --format=csv
  python3 -c "import torch, lightning, litgpt; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__, 'litgpt', litgpt.__version__ if hasattr(litgpt, '__version__') else '0.5.13')"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
suite=(python3 -m pytest docs/benchmarks/gpu/test_syncs_1gpu.py -p no:cacheprovider -q
  --distperf-devices 1 --distperf-accelerator cuda --distperf-baseline-dir "$OUT/baselines")
session() {  # session NAME "ENV=VALUE ..." [pytest arguments]
  local name=$1 t0=$SECONDS
  # shellcheck disable=SC2086  # the assignments are words
  env $2 "${suite[@]}" --distperf-json "$OUT/$name.json" "${@:3}" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s: $(tail -1 "$OUT/$name.log")"
}
session record "" --distperf-update-baselines
for i in 1 2 3; do session "same-$i" ""; done
session block-sync "SYNC_PER_BLOCK=1" -k builder
session item-sync "VERDICT_SYNC=1" -k own_loop
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys, pathlib
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for row in json.loads(path.read_text())["results"]:
        work = (row.get("work") or {}).get("decode") or {}
        print(f"{path.stem:10s} {row['test_id'].split('::')[-1]:14s} {row['verdict']:5s} "
              f"{row['tokens_per_sec']:8.1f} tok/s syncs/token={work.get('syncs')} "
              f"work={row.get('work_status')}: {row.get('work_message', '')[:160]}")
PY
python3 docs/benchmarks/gpu/sync_count_cost.py 2>&1 | tee "$OUT/count_cost.txt"
