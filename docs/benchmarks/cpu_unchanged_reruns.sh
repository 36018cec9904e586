#!/usr/bin/env bash
# Issue 45's target "unchanged reruns stay green" on 2 CPU ranks: the user's suite of
# docs/benchmarks/cpu/test_unchanged_reruns.py (LitGPT pythia-14m from a builder, auto and
# fsdp, 3 repeats, default gates). One recorded session, N unchanged sessions, a slowed one
# (SPIN seconds per attention call: gross, must fail); two more recorded sessions, N unchanged,
# a slowed one again. Target: no unchanged result fails and at most 10% warn, in each phase.
# Usage: [N=10] [SPIN=0.01] bash docs/benchmarks/cpu_unchanged_reruns.sh OUTDIR
# Measure alone: anything else on the cores moves the figures. Needs the litgpt extra.
set -uo pipefail
out=${1:?output directory}; n=${N:-10}; py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH=docs/benchmarks/cpu${PYTHONPATH:+:$PYTHONPATH}
suite=("$py" -m pytest docs/benchmarks/cpu/test_unchanged_reruns.py -p no:cacheprovider -q
  --distperf-devices 2 --distperf-accelerator cpu --distperf-repeats 3
  --distperf-baseline-dir "$out/baselines")
session() {  # session NAME "ENV=VALUE ..." [pytest arguments]
  local name=$1 assignments=$2 t0=$SECONDS; shift 2
  # shellcheck disable=SC2086  # the assignments are words
  env $assignments "${suite[@]}" --distperf-json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s: $(tail -1 "$out/$name.log")"
}
session record-1 "" --distperf-update-baselines
for i in $(seq 1 "$n"); do session "after1-$i" ""; done
session slowed1 "UNCHANGED_SPIN=${SPIN:-0.01}"
for r in 2 3; do session "record-$r" "" --distperf-update-baselines; done
for i in $(seq 1 "$n"); do session "after3-$i" ""; done
session slowed3 "UNCHANGED_SPIN=${SPIN:-0.01}"
"$py" - "$out" <<'PY'
import json, sys
from collections import Counter
from pathlib import Path

out = Path(sys.argv[1])
for phase in ("after1", "after3", "slowed1", "slowed3"):
    rows = [r for p in sorted(out.glob(f"{phase}*.json")) for r in json.loads(p.read_text())["results"]]
    words = Counter(r["verdict"].split(" ")[0] for r in rows)
    changes = ", ".join(f"{r['change']:+.0%}" for r in rows if r.get("change") is not None)
    print(f"{phase}: {len(rows)} results, {dict(words)}; changes {changes}")
PY
