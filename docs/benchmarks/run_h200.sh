#!/usr/bin/env bash
# One pass of the seed-model benchmarks on a CUDA machine; writes logs and JSON under $OUT.
#   bash docs/benchmarks/run_h200.sh nvlink                 # links as the machine has them
#   NCCL_P2P_DISABLE=1 bash docs/benchmarks/run_h200.sh p2p-disabled
# Any further arguments go to pytest (e.g. -k pythia).
set -uo pipefail
name=${1:?pass name}
shift
OUT=${OUT:-/tmp/distperf-bench}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv
  nvidia-smi topo -m
  python3 -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'lightning', lightning.__version__)"
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)' | sort
} > "$OUT/env-$name.txt" 2>&1
python3 -m pytest examples/gpu -p no:cacheprovider --distperf-devices 2 --distperf-accelerator cuda \
  --distperf-repeats 3 --distperf-timeout 400 --distperf-json "$OUT/$name.json" "$@" 2>&1 \
  | tee "$OUT/$name.log" | grep -E 'tok/s|passed|failed|Error|error' | tail -40
