#!/usr/bin/env bash
# Issue 3's table on a 2-GPU machine in one call: the seed models with auto, ddp, fsdp and
# fsdp-noreshard over NVLink, then the same with NCCL_P2P_DISABLE=1. Each pass is bounded so
# that its JSON report is still written (pytest is interrupted, not killed) when time runs out.
#   OUT=/some/dir bash docs/benchmarks/run_h200_table.sh [SECONDS_PER_PASS]
set -uo pipefail
budget=${1:-270}
export OUT=${OUT:-/tmp/distperf-bench}
# NVLink multicast stays off on the lent machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(dirname "$0")
run() { timeout -s INT -k 20 "$budget" bash "$here/run_h200.sh" "$@"; echo "pass $1: rc=$?"; }
run nvlink -k "not fsdp2"
NCCL_P2P_DISABLE=1 run p2p-disabled -k "not fsdp2"
