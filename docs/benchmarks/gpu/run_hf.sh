#!/usr/bin/env bash
# Issue 47 on 1 x H100 (image: torch, lightning, transformers 5.17; no registry): an HF Llama of
# about 1B parameters from a config (hf_llama_1b.json), bf16, through the plugin (auto, fsdp,
# fsdp-noreshard; eager, then --distperf-compile) and the same model's own `generate` timed
# outside it (same prompt length and new tokens, greedy, static cache). Writes logs, JSON and
# summary.txt (plugin tok/s over generate's; the target is 0.9 or more) under $OUT.
#   bash docs/benchmarks/gpu/run_hf.sh
#   STEPS="hf-eager plugin-eager" bash docs/benchmarks/gpu/run_hf.sh     # a part of it
#   STEPS=gpu-test bash docs/benchmarks/gpu/run_hf.sh   # tests/test_hf.py's gpu test (tokens)
set -x
set -uo pipefail
OUT=${OUT:-/tmp/distperf-hf}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1
export DISTPERF_HF_PROMPT=${DISTPERF_HF_PROMPT:-64} DISTPERF_HF_NEW=${DISTPERF_HF_NEW:-64}
HERE=docs/benchmarks/gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse HEAD
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch, lightning, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__, 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
own() {  # the model's own generate: $1 = eager | compiled
  local t0=$SECONDS flag=()
  [[ $1 == eager ]] && flag=(--eager)
  timeout 150 python3 "$HERE/hf_generate_baseline.py" "${flag[@]}" \
    --prompt-length "$DISTPERF_HF_PROMPT" --new-tokens "$DISTPERF_HF_NEW" \
    --out "$OUT/hf-$1.json" > "$OUT/hf-$1.log" 2>&1
  echo "== hf-$1 rc=$? $((SECONDS - t0)) s"; tail -3 "$OUT/hf-$1.log"
}
plugin() {  # the plugin, one rank: $1 = eager | compiled
  local t0=$SECONDS flag=()
  [[ $1 == compiled ]] && flag=(--distperf-compile)
  timeout 240 python3 -m pytest -p no:cacheprovider "$HERE/test_hf_1gpu.py" \
    --distperf-devices 1 --distperf-accelerator cuda --distperf-timeout 200 \
    --distperf-repeats 3 --distperf-baseline-dir "$OUT/baselines" "${flag[@]}" \
    --distperf-json "$OUT/plugin-$1.json" -v > "$OUT/plugin-$1.log" 2>&1
  echo "== plugin-$1 rc=$? $((SECONDS - t0)) s"
  grep -E '^ +[0-9.]+ +|phases|passed|failed|skipped|Error' "$OUT/plugin-$1.log" | tail -12
}
for name in ${STEPS:-hf-eager plugin-eager hf-compiled plugin-compiled}; do
  case $name in
    hf-eager) own eager ;;
    hf-compiled) own compiled ;;
    plugin-eager) plugin eager ;;
    plugin-compiled) plugin compiled ;;
    gpu-test) timeout 300 python3 -m pytest -p no:cacheprovider tests/test_hf.py -m gpu -v \
        > "$OUT/gpu-test.log" 2>&1; echo "== gpu-test rc=$?"; tail -5 "$OUT/gpu-test.log" ;;
    *) echo "unknown step $name" >&2; exit 2 ;;
  esac
done
python3 "$HERE/hf_summary.py" "$OUT"
