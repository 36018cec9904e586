#!/usr/bin/env bash
# Healthy runs' tokens/sec over their modelled prediction on 2 CPU ranks, N unchanged sessions
# of docs/benchmarks/cpu/test_threshold_ratios.py at the default gates (no baseline: only the
# threshold judges); then each test's min, median and max ratio and the status it read.
# Measure alone: anything else on the 2 cores moves the figures.
#   [N=6] [PYTHON=python3] bash docs/benchmarks/cpu_threshold_ratios.sh OUTDIR
set -uo pipefail
out=${1:?output directory}; n=${N:-6}; py=${PYTHON:-python3}
mkdir -p "$out"
for i in $(seq 1 "$n"); do
  "$py" -m pytest docs/benchmarks/cpu/test_threshold_ratios.py -p no:cacheprovider -q \
    --distperf-devices 2 --distperf-accelerator cpu --distperf-repeats 3 \
    --distperf-baseline-dir "$out/baselines-$i" --distperf-json "$out/session-$i.json" \
    > "$out/session-$i.log" 2>&1
  echo "session $i rc=$?: $(tail -1 "$out/session-$i.log")"
done
"$py" - "$out" <<'PY' | tee "$out/summary.md"
import json, pathlib, statistics, sys
ratios, statuses = {}, {}
for report in sorted(pathlib.Path(sys.argv[1]).glob("session-*.json")):
    for row in json.loads(report.read_text())["results"]:
        name = row["test_id"].split("::")[-1]
        if row.get("ratio_to_predicted") is None:
            continue
        ratios.setdefault(name, []).append(row["ratio_to_predicted"])
        statuses.setdefault(name, []).append(row["threshold_status"])
print("| test | sessions | min | median | max | statuses |\n|---|---|---|---|---|---|")
for name, values in ratios.items():
    counts = {s: statuses[name].count(s) for s in sorted(set(statuses[name]))}
    print(f"| {name} | {len(values)} | {min(values):.2f} | {statistics.median(values):.2f} | "
          f"{max(values):.2f} | {', '.join(f'{k} {v}' for k, v in counts.items())} |")
PY
