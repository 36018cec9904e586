#!/usr/bin/env bash
# Run a distperf suite in a CI job, then write a Markdown summary of its JSON report.
# Called by ci/github/distperf.yml and ci/gitlab/distperf.gitlab-ci.yml; runs anywhere.
#
# usage: ci/distperf-ci.sh [--mode compare|update] [--devices N|auto] [--suite PATH]
#                          [--report-dir DIR] [--baseline-dir DIR] [--report JSON]
#                          [--dry-run] [-- EXTRA PYTEST ARGUMENTS...]
#
#   --mode          compare (default): gate on the stored baselines;
#                   update: record or refresh them (--distperf-update-baselines)
#   --devices       ranks per test (default auto: every visible GPU)
#   --suite         tests to run (default tests/perf if it exists, else examples)
#   --report-dir    where distperf.json, benchmark.json, junit.xml, summary.md and
#                   charts/ go (default distperf-report)
#   --baseline-dir  passed as --distperf-baseline-dir (default: the plugin's own setting)
#   --report        the JSON report to summarise (default REPORT_DIR/distperf.json)
#   --dry-run       print the commands instead of running pytest, and summarise --report
#
# Each option has an environment twin, used when the option is absent: MODE, DEVICES, SUITE,
# REPORT_DIR, BASELINE_DIR, REPORT, DRY_RUN=1. Also PYTHON (interpreter, default python),
# SUMMARY_FILE (a file to append the summary to; default $GITHUB_STEP_SUMMARY when set) and
# CHARTS_URL (where the job's artifacts show REPORT_DIR/charts, for the summary's links).
# Exit status: pytest's (a regression fails the job), returned after the summary is written.
set -euo pipefail

die() {
  echo "distperf-ci: $*" >&2
  exit 2
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed -E 's/^# ?//'
}

# Print a command as the shell would read it back (quoted where needed), prefixed like `set -x`.
show() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
}

truthy() {
  case "${1,,}" in
    1 | true | yes | on) return 0 ;;
    *) return 1 ;;
  esac
}

mode="${MODE:-compare}"
devices="${DEVICES:-auto}"
suite="${SUITE:-}"
report_dir="${REPORT_DIR:-distperf-report}"
baseline_dir="${BASELINE_DIR:-}"
report="${REPORT:-}"
dry_run="${DRY_RUN:-0}"
python="${PYTHON:-python}"
summary_file="${SUMMARY_FILE:-${GITHUB_STEP_SUMMARY:-}}"
extra=()

while (($#)); do
  arg="$1"
  shift
  case "$arg" in
    --dry-run)
      dry_run=1
      continue
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    --)
      extra=("$@")
      break
      ;;
    --*=*)
      name="${arg%%=*}"
      value="${arg#*=}"
      ;;
    --*)
      name="$arg"
      (($#)) || die "$arg needs a value (see --help)"
      value="$1"
      shift
      ;;
    *) die "unexpected argument '$arg'; pytest arguments go after -- (see --help)" ;;
  esac
  case "$name" in
    --mode) mode="$value" ;;
    --devices) devices="$value" ;;
    --suite) suite="$value" ;;
    --report-dir) report_dir="$value" ;;
    --baseline-dir) baseline_dir="$value" ;;
    --report) report="$value" ;;
    --dry-run) dry_run="$value" ;;
    *) die "unknown option '$name' (see --help)" ;;
  esac
done

case "$mode" in
  compare) title="distperf: compared with baselines" ;;
  update) title="distperf: baselines recorded" ;;
  *) die "MODE/--mode must be compare or update, got '$mode'" ;;
esac
[[ "$devices" == auto || "$devices" =~ ^[1-9][0-9]*$ ]] ||
  die "DEVICES/--devices must be a positive integer or auto, got '$devices'"
if [[ -z "$suite" ]]; then
  if [[ -d tests/perf ]]; then suite=tests/perf; else suite=examples; fi
fi
report="${report:-$report_dir/distperf.json}"

pytest_cmd=(
  "$python" -m pytest "$suite"
  --distperf-devices "$devices"
  --distperf-json "$report_dir/distperf.json"
  --benchmark-json "$report_dir/benchmark.json"
  --junitxml "$report_dir/junit.xml"
)
if [[ -n "$baseline_dir" ]]; then pytest_cmd+=(--distperf-baseline-dir "$baseline_dir"); fi
if [[ "$mode" == update ]]; then pytest_cmd+=(--distperf-update-baselines); fi
pytest_cmd+=(${extra[@]+"${extra[@]}"})
render_cmd=("$python" -m pytest_distperf.output.markdown "$report" --title "$title")
# Charts (matplotlib, the plot extra): the report's tok/s, and the baselines' history.
charts_dir="$report_dir/charts"
history_dir="${baseline_dir:-distperf-baselines}"
plot_cmd=("$python" -m pytest_distperf.cli plot "$report" -o "$charts_dir/results.png")
history_cmd=("$python" -m pytest_distperf.cli plot --history "$history_dir"
  -o "$charts_dir/history.png")

status=0
show "${pytest_cmd[@]}"
if truthy "$dry_run"; then
  echo "distperf-ci: dry run (mode $mode): pytest not run; summarising $report"
else
  mkdir -p "$report_dir"
  # What the numbers ran on, in the job log; never a reason to fail the job.
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; fi
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "visible GPUs", torch.cuda.device_count())' || true
  "${pytest_cmd[@]}" || status=$?
fi

show "${render_cmd[@]}"
if [[ -f "$report" ]]; then
  if truthy "$dry_run"; then
    "${render_cmd[@]}"
    show "${plot_cmd[@]}"
    show "${history_cmd[@]}"
    exit 0
  fi
  render_status=0
  "${render_cmd[@]}" >"$report_dir/summary.md" || render_status=$?
  if ((render_status != 0)); then
    echo "distperf-ci: could not summarise $report (exit status $render_status)" >&2
    ((status != 0)) || status=$render_status
  fi
else
  note="## $title"$'\n\n'"No distperf report at \`$report\`"
  if truthy "$dry_run"; then
    echo "$note."
    exit 0
  fi
  printf '%s (pytest exit status %s): see the job log.\n' "$note" "$status" >"$report_dir/summary.md"
fi

# A chart that cannot be drawn (no matplotlib, no baselines yet) never fails the job.
charts=()
if [[ -f "$report" ]]; then
  show "${plot_cmd[@]}"
  if "${plot_cmd[@]}"; then charts+=(results.png); else echo "distperf-ci: no results chart" >&2; fi
fi
if [[ -d "$history_dir" ]]; then
  show "${history_cmd[@]}"
  if "${history_cmd[@]}"; then charts+=(history.png); else echo "distperf-ci: no history chart" >&2; fi
fi
if ((${#charts[@]})); then
  # CHARTS_URL: where the job's artifacts show $REPORT_DIR/charts (GitLab sets it); without
  # it the summary names the files in the uploaded report.
  links=()
  for chart in "${charts[@]}"; do
    if [[ -n "${CHARTS_URL:-}" ]]; then
      links+=("[$chart](${CHARTS_URL%/}/$chart)")
    else
      links+=("\`$chart\`")
    fi
  done
  printf "\nCharts (\`%s/\`): %s\n" "$charts_dir" "${links[*]}" >>"$report_dir/summary.md"
fi
cat "$report_dir/summary.md"
if [[ -n "$summary_file" ]]; then cat "$report_dir/summary.md" >>"$summary_file"; fi
exit "$status"
