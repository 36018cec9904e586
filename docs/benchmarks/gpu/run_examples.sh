#!/usr/bin/env bash
# The example suite on one CUDA device (carry .whl: litgpt 0.5.13 and its needs), issue 45:
# session 1 records the baselines, session 2 reruns unchanged against them; each writes its
# JSON, and measuring_share.py prints each test's measuring phases over its timed repeats.
# Then the sync count's GPU test (the counted and profiled generation is one pass).
#   OUT=/tmp/ex bash docs/benchmarks/gpu/run_examples.sh
#   SESSIONS="1" FILES="examples/test_fsdp_slowdown.py" bash docs/benchmarks/gpu/run_examples.sh
# FILES2: what session 2 reruns (default: FILES); STEPS=no-syncs leaves out the sync test.
set -uo pipefail
OUT=${OUT:-/tmp/distperf-examples}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse HEAD 2>/dev/null
  nvidia-smi --query-gpu=index,name,serial,driver_version,memory.total --format=csv
  python3 -c "import torch, lightning, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__, 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
LIMIT=${LIMIT:-240}  # seconds per session
for i in ${SESSIONS:-1 2}; do
  t0=$SECONDS
  extra=()
  [[ $i == 1 ]] && extra=(--distperf-update-baselines)
  # shellcheck disable=SC2086  # FILES is a list of paths
  files=${FILES:-examples}
  [[ $i == 2 ]] && files=${FILES2:-$files}
  timeout "$LIMIT" python3 -m pytest $files -p no:cacheprovider -v \
    --distperf-devices 1 --distperf-accelerator cuda --distperf-timeout "$LIMIT" \
    --distperf-baseline-dir "$OUT/baselines" --distperf-json "$OUT/session-$i.json" \
    "${extra[@]}" > "$OUT/session-$i.log" 2>&1
  echo "== session $i rc=$? $((SECONDS - t0)) s: $(tail -1 "$OUT/session-$i.log")"
  grep -E "PASSED|FAILED|ERROR|SKIPPED" "$OUT/session-$i.log" | cut -c1-150
  python3 docs/benchmarks/measuring_share.py "$OUT/session-$i.json" | tee "$OUT/share-$i.txt"
done
[[ ${STEPS:-} == no-syncs ]] && exit 0
t0=$SECONDS
timeout 200 python3 -m pytest tests/test_syncs.py -p no:cacheprovider -q > "$OUT/syncs.log" 2>&1
echo "== tests/test_syncs.py rc=$? $((SECONDS - t0)) s: $(tail -1 "$OUT/syncs.log")"
