#!/usr/bin/env bash
# Where a 2-GPU host's eager-decode speed wanders (host_noise_probe.py), one process alone, two
# at once (as two ranks), and the same pinned to distinct physical cores. Writes under $OUT.
#   OUT=/some/dir bash docs/benchmarks/run_h200_noise.sh [SECONDS_PER_PROBE]
set -uo pipefail
seconds=${1:-40}
OUT=${OUT:-/tmp/distperf-noise}
mkdir -p "$OUT"
here=$(dirname "$0")
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  lscpu
  lscpu -p=CPU,CORE,SOCKET,NODE
  echo "numactl: $(command -v numactl || echo missing)"
  for g in /sys/bus/pci/devices/*/numa_node; do echo "$g $(cat "$g")"; done | grep -v ' -1$' | head
  cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>&1
  nvidia-smi -q -d PERFORMANCE,CLOCK | head -80
  python3 -c "import torch; print('torch', torch.__version__)"
} > "$OUT/noise-env.txt" 2>&1
# Two distinct physical cores (first logical CPU of the 3rd and of the 7th core).
mapfile -t cpus < <(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1)
a=${cpus[2]:-2} b=${cpus[6]:-6}
probe() { python3 "$here/host_noise_probe.py" --seconds "$seconds" "$@"; }
probe --gpu 0 --out "$OUT/alone.jsonl"
probe --gpu 0 --out "$OUT/pair-0.jsonl" & probe --gpu 1 --out "$OUT/pair-1.jsonl"; wait
taskset -c "$a" python3 "$here/host_noise_probe.py" --seconds "$seconds" --gpu 0 --out "$OUT/pinned-0.jsonl" &
taskset -c "$b" python3 "$here/host_noise_probe.py" --seconds "$seconds" --gpu 1 --out "$OUT/pinned-1.jsonl"
wait
echo "pinned to $a and $b" >> "$OUT/noise-env.txt"
