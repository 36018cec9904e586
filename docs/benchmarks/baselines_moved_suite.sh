#!/usr/bin/env bash
# Issue 46 on real ranks: the example suite copied to perf/ of a fresh git repository, as a user
# keeps it (no ini file), run as the issue's user did:
#   1. inside perf/, `pytest . --distperf-baseline-dir ../baselines --distperf-update-baselines`
#      while ../baselines does not exist yet (the rootdir is perf/);
#   2. the same without the update flag: ../baselines now exists, the rootdir moves up to the
#      repository, and every test must still find its baseline (no "no baseline", no orphans);
#   3. `pytest perf/` from the repository: the same entries again;
#   4. a refresh, then `distperf baselines diff HEAD:baselines baselines` (each changed test with
#      its old and new median), and `distperf baselines list`.
# Functional, not a measurement. Usage: [ACCELERATOR=cpu DEVICES=2] bash THIS OUTDIR
set -uo pipefail
out=$(realpath -m "${1:?output directory}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
mkdir -p "$out"
work=$(mktemp -d)
git init -q "$work"
cp -r "$repo/examples" "$work/perf"
args=(--distperf-devices "${DEVICES:-2}" --distperf-accelerator "${ACCELERATOR:-cpu}"
  -p no:cacheprovider)
run() {  # name, directory, pytest arguments...
  local name=$1 dir=$2
  shift 2
  (cd "$dir" && "$py" -m pytest "${args[@]}" "$@" --distperf-json "$out/$name.json") \
    >"$out/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 "$out/$name.log")"
  echo "  $(grep -m1 '^rootdir' "$out/$name.log")"
  echo "  'no baseline' notes: $(grep -c 'no baseline for this test' "$out/$name.log")," \
    "orphan warnings: $(grep -c 'distperf baseline orphans' "$out/$name.log")"
}
run 1-record "$work/perf" . --distperf-baseline-dir ../baselines --distperf-update-baselines
git -C "$work" add baselines && git -C "$work" -c user.name=t -c user.email=t@example.com \
  commit -q -m baselines
run 2-moved-rootdir "$work/perf" . --distperf-baseline-dir ../baselines
run 3-from-repository "$work" perf --distperf-baseline-dir baselines
run 4-refresh "$work" perf --distperf-baseline-dir baselines --distperf-update-baselines
(cd "$work" && "$py" -m pytest_distperf.cli baselines diff HEAD:baselines baselines) \
  | tee "$out/5-diff.txt"
(cd "$work" && "$py" -m pytest_distperf.cli baselines list baselines) | tee "$out/6-list.txt"
rm -rf "$work"
