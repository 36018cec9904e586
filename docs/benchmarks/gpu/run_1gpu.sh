#!/usr/bin/env bash
# One call on a 1 x H200 machine: the example suite through the rank pool (eager, then compiled),
# LitGPT pythia-1b, tp/pipeline on one rank. The compiled suite from a cold compile cache needs
# more than one call (h200-2026-12-01-gate3.md): pick steps per call, e.g.
#   STEPS=suite-compiled PYTEST_ADDOPTS="-k 'llama or pythia_2'" bash ...
#   STEPS=suite-compiled PYTEST_ADDOPTS="-k 'not llama and not pythia_2'" bash ...
#   bash docs/benchmarks/gpu/run_1gpu.sh            # writes logs and JSON under $OUT
set -uo pipefail
OUT=${OUT:-/tmp/distperf-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
if ls .whl/*.whl >/dev/null 2>&1; then  # litgpt and what it imports that the image lacks
  python3 -c "import psutil" 2>/dev/null && rm -f .whl/psutil-*.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'lightning', lightning.__version__)"
  python3 -c "from importlib.metadata import version; print('litgpt', version('litgpt'))" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
common=(-p no:cacheprovider --distperf-devices 1 --distperf-accelerator cuda --distperf-timeout 400)
step() { local name=$1; shift; local t0=$SECONDS
  python3 -m pytest "${common[@]}" --distperf-json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? $((SECONDS - t0)) s"; grep -E '^ +[0-9.]+ +|passed|failed|skipped' "$OUT/$name.log" | tail -16; }
STEPS=${STEPS:-suite-eager suite-compiled litgpt-pythia-1b tp-pipeline-1}
for name in $STEPS; do
  case $name in
    suite-eager) step suite-eager examples ;;
    suite-compiled) step suite-compiled examples --distperf-compile ;;
    litgpt-pythia-1b) step litgpt-pythia-1b docs/benchmarks/gpu/test_litgpt_1gpu.py ;;
    tp-pipeline-1) step tp-pipeline-1 docs/benchmarks/gpu/test_one_rank_strategies.py ;;
    *) echo "unknown step $name" >&2; exit 2 ;;
  esac
done
