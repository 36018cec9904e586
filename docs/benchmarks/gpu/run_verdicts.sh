#!/usr/bin/env bash
# Issue 36's two cases on one CUDA device: a host sync per token (`.item()` of one logit per
# step) in a user's own generate loop, and CPU-bound processes on every core beside the rank's
# host thread; each after RECORDS sessions recorded the baselines on the idle machine, every
# gate at its default. The suite is docs/benchmarks/cpu/test_verdict_matrix.py with
# VERDICT_MODEL (default pythia-410m) in fp32.
#   OUT=/tmp/v [N=3] [RECORDS=3] bash docs/benchmarks/gpu/run_verdicts.sh
set -uo pipefail
OUT=${OUT:-/tmp/distperf-verdicts}; n=${N:-3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=docs/benchmarks/cpu VERDICT_MODEL=${VERDICT_MODEL:-pythia-410m}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
{
  date -u +%Y-%m-%dT%H:%M:%SZ; nproc
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
suite=(python3 -m pytest docs/benchmarks/cpu/test_verdict_matrix.py -p no:cacheprovider -q
  -k "own_loop or auto" --distperf-devices 1 --distperf-accelerator cuda
  --distperf-repeats 10 --distperf-baseline-dir "$OUT/baselines")
session() {  # session NAME "ENV=VALUE ..."
  local name=$1 t0=$SECONDS
  # shellcheck disable=SC2086  # the assignments are words
  env $2 "${suite[@]}" --distperf-json "$OUT/$name.json" "${@:3}" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s: $(tail -1 "$OUT/$name.log")"
}
for r in $(seq 1 "${RECORDS:-3}"); do session "record-$r" "" --distperf-update-baselines; done
for i in $(seq 1 "$n"); do session "host-sync-$i" "VERDICT_SYNC=1" -k own_loop; done
pids=(); for _ in $(seq 1 "$(nproc)"); do python3 -c "while True: pass" & pids+=($!); done
for i in $(seq 1 "$n"); do session "neighbour-$i" ""; done
kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null
python3 docs/benchmarks/verdict_matrix_summary.py "$OUT" | tee "$OUT/summary.md"
