"""The GPU CI templates in ci/: schema-valid workflows, a shell script that lints and dry-runs.

Schema checks use check-jsonschema's vendored schemas (offline); they and shellcheck are skipped,
with the reason, where the tool is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ci_report import REPORT

from pytest_distperf.output.markdown import parse_report, render_markdown

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "distperf-ci.sh"
GITHUB = ROOT / "ci" / "github" / "distperf.yml"
GITLAB = ROOT / "ci" / "gitlab" / "distperf.gitlab-ci.yml"

# What the script reads from its environment (besides PYTHON).
SCRIPT_ENV = frozenset(
    {"MODE", "DEVICES", "SUITE", "REPORT_DIR", "BASELINE_DIR", "REPORT", "DRY_RUN"}
    | {"SUMMARY_FILE", "GITHUB_STEP_SUMMARY", "CHARTS_URL"}
)
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --- schemas -------------------------------------------------------------------------------------


def _check_jsonschema() -> list[str]:
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        pytest.skip("check-jsonschema is not installed (pip install check-jsonschema)")
    return [sys.executable, "-m", "check_jsonschema"]


@pytest.mark.parametrize(
    ("schema", "path"),
    [("vendor.github-workflows", GITHUB), ("vendor.gitlab-ci", GITLAB)],
    ids=["github", "gitlab"],
)
def test_workflow_matches_its_public_schema(schema: str, path: Path) -> None:
    command = [*_check_jsonschema(), "--builtin-schema", schema, str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("schema", "path", "old", "new"),
    [
        ("vendor.github-workflows", GITHUB, "  contents: read\n", "  contents: sudo\n"),
        ("vendor.gitlab-ci", GITLAB, "      when: never\n", "      when: sometimes\n"),
    ],
    ids=["github", "gitlab"],
)
def test_schema_check_rejects_a_broken_copy(
    schema: str, path: Path, old: str, new: str, tmp_path: Path
) -> None:
    """The check has teeth: one invalid value in a copy of the template fails it."""
    text = path.read_text()
    assert old in text
    broken = tmp_path / path.name
    broken.write_text(text.replace(old, new, 1))
    command = [*_check_jsonschema(), "--builtin-schema", schema, str(broken)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr


# --- what the templates do -----------------------------------------------------------------------


def _load(path: Path) -> dict:
    yaml = pytest.importorskip("yaml")  # PyYAML, a dependency of lightning
    return yaml.safe_load(path.read_text())


def _github() -> dict:
    workflow = _load(GITHUB)
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads `on` as true
    return workflow


def test_github_workflow_flow() -> None:
    workflow = _github()
    assert set(workflow["on"]) == {"pull_request", "push", "workflow_dispatch"}
    assert workflow["on"]["push"]["branches"] == ["main"]
    assert workflow["permissions"] == {"contents": "read"}
    baseline_dir = workflow["env"]["BASELINE_DIR"]
    # merging the baseline pull request must not trigger another refresh
    assert workflow["on"]["push"]["paths-ignore"] == [f"{baseline_dir}/**"]
    jobs = workflow["jobs"]
    assert set(jobs) == {"compare", "update"}
    for name, mode in (("compare", "compare"), ("update", "update")):
        job = jobs[name]
        assert job["runs-on"] == ["self-hosted", "gpu"]
        runs = [step for step in job["steps"] if step.get("run") == "bash ci/distperf-ci.sh"]
        assert len(runs) == 1 and runs[0]["env"] == {"MODE": mode}
        uploads = [
            s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")
        ]
        assert uploads[0]["if"] == "always()"
        assert uploads[0]["with"]["path"] == "${{ env.REPORT_DIR }}"
        # the charts on their own, linked from the job summary
        charts = [step for step in uploads if step.get("id") == "charts"]
        assert len(charts) == 1 and charts[0]["if"] == "always()"
        assert charts[0]["with"]["path"] == "${{ env.REPORT_DIR }}/charts"
        [link] = [s for s in job["steps"] if "steps.charts.outputs" in str(s.get("if", ""))]
        assert link["env"] == {"CHARTS_ARTIFACT": "${{ steps.charts.outputs.artifact-url }}"}
        assert "$CHARTS_ARTIFACT" in link["run"] and '"$GITHUB_STEP_SUMMARY"' in link["run"]
    assert (
        "pull_request" in jobs["compare"]["if"] and "head.repo.full_name" in jobs["compare"]["if"]
    )
    assert "push" in jobs["update"]["if"]
    assert jobs["update"]["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert "secrets." not in GITHUB.read_text()  # GITHUB_TOKEN only


def test_gitlab_pipeline_flow() -> None:
    pipeline = _load(GITLAB)
    base = pipeline[".distperf"]
    assert base["tags"] == ["gpu"]
    assert base["artifacts"]["when"] == "always"
    assert base["artifacts"]["reports"]["junit"] == f"{base['variables']['REPORT_DIR']}/junit.xml"
    # the summary links the charts where the job's artifacts show them
    assert base["variables"]["CHARTS_URL"] == "${CI_JOB_URL}/artifacts/file/${REPORT_DIR}/charts"
    assert f"{base['variables']['REPORT_DIR']}/" in base["artifacts"]["paths"]
    compare, update = pipeline["distperf:compare"], pipeline["distperf:update"]
    for job, mode in ((compare, "compare"), (update, "update")):
        assert job["extends"] == ".distperf"
        assert job["variables"] == {"MODE": mode}
        assert job["script"][0] == "bash ci/distperf-ci.sh"
    assert compare["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "merge_request_event"'}]
    assert update["rules"][0]["when"] == "never"  # the baseline merge request's own merge
    assert "$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH" in update["rules"][1]["if"]
    assert "$BASELINE_DIR/" in update["artifacts"]["paths"]


def _shell_blocks() -> list[str]:
    """Every inline shell script of both templates."""
    blocks = [
        step["run"] for job in _github()["jobs"].values() for step in job["steps"] if "run" in step
    ]
    for job in _load(GITLAB).values():
        if isinstance(job, dict):
            blocks += job.get("before_script", []) + job.get("script", [])
    return blocks


# --- the script: syntax and lint -----------------------------------------------------------------


def test_script_parses() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert os.access(SCRIPT, os.X_OK), "ci/distperf-ci.sh must be executable"
    assert "set -euo pipefail" in SCRIPT.read_text()


def test_inline_scripts_parse() -> None:
    for block in _shell_blocks():
        done = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
        assert done.returncode == 0, f"{done.stderr}\n{block}"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck() -> None:
    done = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    for block in _shell_blocks():
        done = subprocess.run(
            ["shellcheck", "-s", "bash", "-"], input=block, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{done.stdout}\n{block}"


# --- the script: dry runs ------------------------------------------------------------------------


def _run_script(
    *args: str, cwd: Path, env: dict[str, str] | None = None, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    # The script reads these; the test's own environment (a CI job, say) must not leak in.
    base = {key: value for key, value in os.environ.items() if key not in SCRIPT_ENV}
    base["PYTHON"] = python
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _commands(stdout: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


@pytest.fixture
def report(tmp_path: Path) -> Path:
    path = tmp_path / "sample" / "distperf.json"
    path.parent.mkdir()
    path.write_text(json.dumps(REPORT))
    return path


def test_dry_run_compare(tmp_path: Path, report: Path) -> None:
    done = _run_script("--dry-run", "--report", str(report), "--devices", "4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    pytest_cmd, render_cmd, plot_cmd, history_cmd = _commands(done.stdout)
    assert pytest_cmd == [
        sys.executable, "-m", "pytest", "examples",
        "--distperf-devices", "4",
        "--distperf-json", "distperf-report/distperf.json",
        "--benchmark-json", "distperf-report/benchmark.json",
        "--junitxml", "distperf-report/junit.xml",
    ]  # fmt: skip
    assert render_cmd == [
        sys.executable, "-m", "pytest_distperf.output.markdown", str(report),
        "--title", "distperf: compared with baselines",
    ]  # fmt: skip
    assert plot_cmd == [
        sys.executable, "-m", "pytest_distperf.cli", "plot", str(report),
        "-o", "distperf-report/charts/results.png",
    ]  # fmt: skip
    assert history_cmd == [
        sys.executable, "-m", "pytest_distperf.cli", "plot", "--history", "distperf-baselines",
        "-o", "distperf-report/charts/history.png",
    ]  # fmt: skip
    assert "## distperf: compared with baselines" in done.stdout
    assert (
        "| `examples/test_generate.py::test_generate[fsdp]` | fsdp | 2 | 412.3 | 600.0 | -31.3% "
        "| 0.301 | -2.1% | **FAIL (baseline)** |" in done.stdout
    )
    assert not (tmp_path / "distperf-report").exists()  # a dry run writes nothing


def test_dry_run_update_from_the_environment(tmp_path: Path, report: Path) -> None:
    (tmp_path / "tests" / "perf").mkdir(parents=True)  # the default suite when it exists
    env = {
        "DRY_RUN": "1",
        "MODE": "update",
        "REPORT": str(report),
        "REPORT_DIR": "out dir",
        "BASELINE_DIR": "perf/baselines",
    }
    done = _run_script("--", "-k", "generate and not slow", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    pytest_cmd = _commands(done.stdout)[0]
    assert pytest_cmd == [
        sys.executable, "-m", "pytest", "tests/perf",
        "--distperf-devices", "auto",
        "--distperf-json", "out dir/distperf.json",
        "--benchmark-json", "out dir/benchmark.json",
        "--junitxml", "out dir/junit.xml",
        "--distperf-baseline-dir", "perf/baselines",
        "--distperf-update-baselines",
        "-k", "generate and not slow",
    ]  # fmt: skip
    assert "## distperf: baselines recorded" in done.stdout
    assert _commands(done.stdout)[-1][3:6] == ["plot", "--history", "perf/baselines"]


def test_options_override_the_environment(tmp_path: Path, report: Path) -> None:
    env = {"MODE": "update", "DEVICES": "8", "SUITE": "nowhere"}
    done = _run_script(
        "--dry-run",
        "--mode=compare",
        "--devices",
        "2",
        "--suite",
        "perf",
        "--report",
        str(report),
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    pytest_cmd = _commands(done.stdout)[0]
    assert pytest_cmd[3:6] == ["perf", "--distperf-devices", "2"]
    assert "--distperf-update-baselines" not in pytest_cmd


def test_dry_run_without_a_report(tmp_path: Path) -> None:
    done = _run_script("--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "No distperf report at `distperf-report/distperf.json`." in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "refresh"], "must be compare or update, got 'refresh'"),
        (["--devices", "0"], "positive integer or auto, got '0'"),
        (["--devices"], "--devices needs a value"),
        (["--colour", "red"], "unknown option '--colour'"),
        (["tests/perf"], "pytest arguments go after --"),
    ],
)
def test_bad_arguments(args: list[str], message: str, tmp_path: Path) -> None:
    done = _run_script("--dry-run", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr


def test_help(tmp_path: Path) -> None:
    done = _run_script("--help", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.startswith("Run a distperf suite")
    assert "--dry-run" in done.stdout and "set -euo" not in done.stdout


# --- the script: a real run, with pytest stubbed -------------------------------------------------

STUB = """\
import json, os, sys
args = sys.argv[1:]
if args[:2] == ["-m", "pytest"]:
    with open(os.environ["STUB_LOG"], "w") as log:
        json.dump(args, log)
    if os.environ.get("STUB_REPORT"):
        path = args[args.index("--distperf-json") + 1]
        with open(path, "w") as report:
            report.write(os.environ["STUB_REPORT"])
    sys.exit(int(os.environ.get("STUB_STATUS", "0")))
if args[:1] == ["-c"]:
    sys.exit(0)  # the torch banner: not needed here
os.execv(sys.executable, [sys.executable, *args])
"""


@pytest.fixture
def stub_python(tmp_path: Path) -> Path:
    """A `python` that fakes `-m pytest` (logs its arguments, writes a report) and runs the rest."""
    path = tmp_path / "bin" / "python"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\n{STUB}")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("status", [0, 1])
def test_run_writes_the_summary_and_returns_pytest_status(
    status: int, tmp_path: Path, stub_python: Path
) -> None:
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    env = {
        "STUB_LOG": str(tmp_path / "argv.json"),
        "STUB_REPORT": json.dumps(REPORT),
        "STUB_STATUS": str(status),
        "GITHUB_STEP_SUMMARY": str(summary),
        "REPORT_DIR": str(tmp_path / "reports"),
    }
    done = _run_script("--devices", "2", cwd=tmp_path, env=env, python=str(stub_python))
    assert done.returncode == status, done.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:6] == ["-m", "pytest", "examples", "--distperf-devices", "2", "--distperf-json"]
    written = (tmp_path / "reports" / "summary.md").read_text()
    table = render_markdown(parse_report(REPORT), title="distperf: compared with baselines")
    charts = f"\nCharts (`{tmp_path}/reports/charts/`): `results.png`\n" if HAS_MATPLOTLIB else ""
    assert written == table + charts
    assert summary.read_text() == "earlier step\n" + written
    assert written in done.stdout


def _record_baselines(directory: Path, refreshes: int) -> None:
    from datetime import datetime, timezone

    from pytest_distperf.store.entry import BaselineEntry
    from pytest_distperf.store.store import BaselineStore

    store = BaselineStore(directory)
    for run in range(refreshes):
        samples = [100.0 + run + i for i in range(5)]
        entry = BaselineEntry.from_samples(
            "examples/test_generate.py::test_generate[ddp] [model=tiny]",
            samples,
            peak_memory_bytes=None,
            versions={},
            now=datetime(2026, 12, 1, run, tzinfo=timezone.utc),
        )
        old = store.load("cpu_x2_loopbackx1_2cpus").get(entry.test_id)
        entry = entry.following(old) if old else entry
        store.save("cpu_x2_loopbackx1_2cpus", {entry.test_id: entry}, {})


@pytest.mark.slow
@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (the plot extra)")
def test_run_draws_the_charts_and_links_them(tmp_path: Path, stub_python: Path) -> None:
    _record_baselines(tmp_path / "perf" / "baselines", refreshes=3)
    env = {
        "STUB_LOG": str(tmp_path / "argv.json"),
        "STUB_REPORT": json.dumps(REPORT),
        "REPORT_DIR": "out",
        "BASELINE_DIR": "perf/baselines",
        "CHARTS_URL": "https://ci.example/job/7/artifacts/file/out/charts/",
    }
    done = _run_script(cwd=tmp_path, env=env, python=str(stub_python))
    assert done.returncode == 0, done.stderr
    for name in ("results.png", "history.png"):
        data = (tmp_path / "out" / "charts" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    assert (
        (tmp_path / "out" / "summary.md")
        .read_text()
        .endswith(
            "\nCharts (`out/charts/`): "
            "[results.png](https://ci.example/job/7/artifacts/file/out/charts/results.png) "
            "[history.png](https://ci.example/job/7/artifacts/file/out/charts/history.png)\n"
        )
    )


@pytest.mark.slow
def test_a_chart_that_cannot_be_drawn_does_not_fail_the_job(
    tmp_path: Path, stub_python: Path
) -> None:
    (tmp_path / "distperf-baselines").mkdir()  # a baseline directory with nothing in it yet
    env = {"STUB_LOG": str(tmp_path / "argv.json"), "STUB_REPORT": json.dumps(REPORT)}
    done = _run_script(cwd=tmp_path, env=env, python=str(stub_python))
    assert done.returncode == 0, done.stderr
    assert "no baselines recorded there" in done.stderr
    assert "distperf-ci: no history chart" in done.stderr


def test_run_without_a_report(tmp_path: Path, stub_python: Path) -> None:
    env = {"STUB_LOG": str(tmp_path / "argv.json"), "STUB_STATUS": "3", "REPORT_DIR": "r"}
    done = _run_script(cwd=tmp_path, env=env, python=str(stub_python))
    assert done.returncode == 3
    assert (
        "No distperf report at `r/distperf.json` (pytest exit status 3)"
        in (tmp_path / "r" / "summary.md").read_text()
    )


# --- the refresh's pull / merge request summary: `distperf baselines diff` ------------------------


def _summary_block(job_script: str) -> tuple[str, str]:
    """The lines of a template's update job that write the refresh's summary, and the variable
    naming the file they write."""
    lines = job_script.splitlines()
    [first] = [i for i, line in enumerate(lines) if 'refresh-baselines.md"' in line]
    last = next(i for i in range(first, len(lines)) if lines[i].lstrip().startswith("} >"))
    return "\n".join(lines[first : last + 1]), lines[first].split("=")[0].strip()


def _update_scripts() -> dict[str, str]:
    github = "\n".join(
        step["run"] for step in _github()["jobs"]["update"]["steps"] if "run" in step
    )
    gitlab = "\n".join(_load(GITLAB)["distperf:update"]["script"])
    return {"github": github, "gitlab": gitlab}


def test_the_refresh_request_carries_the_baselines_diff() -> None:
    scripts = _update_scripts()
    diff = '-m pytest_distperf.cli baselines diff --markdown "HEAD:$BASELINE_DIR" "$BASELINE_DIR"'
    for name, script in scripts.items():
        assert diff in script, name
        # made before the commit: HEAD still holds the committed baselines
        assert script.index(diff) < script.index("commit --quiet"), name
    assert scripts["github"].count('--body-file "$body"') == 2  # a new request, or the open one
    assert 'cat "$body" >>"$GITHUB_STEP_SUMMARY"' in scripts["github"]
    assert '-F "$message"' in scripts["gitlab"]  # a new merge request's description


@pytest.mark.parametrize("template", ["github", "gitlab"])
def test_the_refresh_summary_names_each_changed_test(template: str, tmp_path: Path) -> None:
    """The templates' own lines, run in a repository whose committed baseline was refreshed."""
    from pytest_distperf.store.entry import BaselineEntry
    from pytest_distperf.store.store import BaselineStore

    environ = {**os.environ, "PYTHON": sys.executable, "BASELINE_DIR": "perf/baselines",
               "REPORT_DIR": "out", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}  # fmt: skip
    # what the CI services set
    for name in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID", "GITHUB_SHA",
                 "CI_COMMIT_SHORT_SHA", "CI_JOB_URL"):  # fmt: skip
        environ[name] = f"<{name}>"
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    store = BaselineStore(tmp_path / "perf" / "baselines")
    test_id = "perf/test_decode.py::test_decode[fsdp-2cpu] [model=pythia-14m]"
    for rate, commit in ((100.0, True), (90.0, False)):
        entry = BaselineEntry.from_samples(test_id, [rate, rate, rate], None, {})
        store.save("cpu_x2_loopbackx1_2cpus", {test_id: entry}, {})
        if commit:
            for args in (["init", "-q"], ["add", "perf"], ["commit", "-q", "-m", "baselines"]):
                subprocess.run(["git", *args], cwd=tmp_path, env=environ, check=True)
    (tmp_path / "out").mkdir()
    block, variable = _summary_block(_update_scripts()[template])
    script = f'set -euo pipefail\n{block}\ncat "${variable}"\n'
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=environ, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        f"| changed | `cpu_x2_loopbackx1_2cpus` | `{test_id}` | 100 | 90 | -10.0% |" in done.stdout
    )
    assert "diff failed" not in done.stdout
