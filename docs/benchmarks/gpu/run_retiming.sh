#!/usr/bin/env bash
# One call per tree on one warm 1-GPU machine: the example suite (eager, LitGPT's test
# deselected: no litgpt there) through the rank pool, with the code of TREE (a plain copy of an
# older commit, e.g. `git archive 4baf3c9 | tar -x -C before`, carried; "." for the checkout).
#   TREE=before NAME=before bash docs/benchmarks/gpu/run_retiming.sh
#   TREE=. NAME=after bash docs/benchmarks/gpu/run_retiming.sh
set -uo pipefail
OUT=${OUT:-/tmp/distperf-gpu}
TREE=${TREE:-.}
NAME=${NAME:-after}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
(cd "$TREE" && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1) || exit 1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__)"
} > "$OUT/env-$NAME.txt" 2>&1
cat "$OUT/env-$NAME.txt"
t0=$SECONDS
(cd "$TREE" && python3 -m pytest examples -p no:cacheprovider -v -k 'not litgpt' \
  --distperf-devices 1 --distperf-accelerator cuda --distperf-timeout 400 \
  --distperf-json "$OUT/$NAME.json") > "$OUT/$NAME.log" 2>&1
echo "== $NAME rc=$? $((SECONDS - t0)) s"
grep -E 'passed|failed' "$OUT/$NAME.log" | tail -2
