#!/usr/bin/env bash
# Baseline gate on a 2-GPU machine: record baselines for the example suite
# (examples/test_fsdp_slowdown.py), rerun it unchanged N times, then once with the slow-down
# knob at 10%. pytest runs inside torchrun (one pytest per GPU, the plugin's in-job mode), so
# each pass pays start-up once instead of once per test. Logs, JSON reports and the baselines
# go into $OUT/gates.tgz.
#   OUT=/some/dir [RECORDS=3] [REPEATS=10] bash docs/benchmarks/run_h200_gates.sh [RERUNS]
# RECORDS refreshes build the entries' run history, as main-branch CI refreshing them would.
# Split over two device calls (one call's limit holds ~12 passes): the second call starts from
# the first one's baselines, SEED_BASELINES=dir RECORDS=0 RERUN_FROM=8; SLOWED=0 skips the
# slowed pass. The host's CPU speed is sampled throughout (host-speed.jsonl; each pass's start
# and end are in passes.txt) so that a slow pass can be laid beside it.
set -uo pipefail
reruns=${1:-10}
OUT=${OUT:-/tmp/distperf-gates}
work=$(mktemp -d)
mkdir -p "$work/baselines"
if [[ -n ${SEED_BASELINES:-} ]]; then cp "$SEED_BASELINES"/*.json "$work/baselines/" || exit 1; fi
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on the lent machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
python3 "$(dirname "$0")/host_speed_sampler.py" --out "$work/host-speed.jsonl" &
sampler=$!
# Toy models: per-call overheads dominate them, so the threshold is set low (see h200 doc);
# the baselines are what is under test here. Many repeats: a short generation is noisy.
base=(timeout -s INT -k 10 90 torchrun --standalone --nproc-per-node 2 -m pytest
  examples/test_fsdp_slowdown.py -p no:cacheprovider -q --distperf-accelerator cuda
  --distperf-baseline-dir "$work/baselines" --distperf-efficiency 0.3 --distperf-repeats "${REPEATS:-10}")
last=0
pass() {
  local name=$1; shift
  local start=$SECONDS rc began
  began=$(date +%s.%N)
  "$@" --distperf-json "$work/$name.json" > "$work/$name.log" 2>&1
  rc=$?
  last=$((SECONDS - start))
  echo "$name $began $(date +%s.%N) rc=$rc" >> "$work/passes.txt"
  echo "$name: rc=$rc $last s $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$work/$name.log" | tail -1)"
}
# DEADLINE (seconds, default 540): no rerun starts unless two more passes still fit, so the
# slowed pass and the archive always happen within a device call's limit.
deadline=${DEADLINE:-540}
for r in $(seq 1 "${RECORDS:-1}"); do
  pass "record-$r" "${base[@]}" --distperf-update-baselines
done
first=${RERUN_FROM:-1}
for i in $(seq "$first" $((first + reruns - 1))); do
  if ((SECONDS + 2 * last > deadline)); then echo "deadline: stopped before rerun $i"; break; fi
  pass "rerun-$i" "${base[@]}"
done
if [[ ${SLOWED:-1} == 1 ]]; then DISTPERF_SLOWDOWN=0.1 pass slow10 "${base[@]}"; fi
kill "$sampler"
tar czf "$OUT/gates.tgz" -C "$work" . && rm -rf "$work"
