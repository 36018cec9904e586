"""A test's baseline identity survives a moved rootdir, another working directory and (with
`distperf baselines rename`) a renamed file; entries that no test matches are named once.

The launcher is faked (tests/helpers.py): no rank starts, each session's runs are alike, so a
test found its baseline exactly when its baseline check compared (`baseline_tokens_per_sec`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import FAKE_LAUNCH_CONFTEST

from pytest_distperf.cli import main as distperf_main
from pytest_distperf.store.identity import repository_nodeid, split_identity
from pytest_distperf.store.orphans import FILE_RENAMED, PATH_MOVED, WORKLOAD_CHANGED, find_orphans
from pytest_distperf.store.store import BaselineStore

TEST_DECODE = """
import pytest

@pytest.mark.distperf(model="pythia-14m", max_new_tokens=12)
def test_decode(distperf):
    distperf.run()
"""
COMMON = ("--distperf-accelerator=cpu", "--distperf-devices=2", "-p", "no:benchmark")
ORPHANS_HEADING = "distperf baseline orphans"


def _git_init(path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)


def _suite(pytester: pytest.Pytester, *, git: bool = True, name: str = "test_decode") -> Path:
    """A repository with its perf suite in perf/ (no ini file), as the issue's user had it."""
    if git:
        _git_init(pytester.path)
    perf = pytester.mkdir("perf")
    (perf / "conftest.py").write_text(FAKE_LAUNCH_CONFTEST)
    (perf / f"{name}.py").write_text(TEST_DECODE)
    return perf


def _run(pytester: pytest.Pytester, cwd: Path, *args: str, json_name: str = "r.json") -> Any:
    report = pytester.path / json_name
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        result = pytester.runpytest(*COMMON, f"--distperf-json={report}", *args)
    result.report = json.loads(report.read_text())
    return result


def _compared(result: Any) -> dict[str, bool]:
    """test name -> whether its baseline check found an entry to compare with."""
    return {
        row["test_id"].split("::")[-1]: row.get("baseline_tokens_per_sec") is not None
        for row in result.report["results"]
    }


def _entries(directory: Path) -> dict[str, Any]:
    store = BaselineStore(directory)
    keys = store.keys()
    return {test_id: e for key in keys for test_id, e in store.load(key).items()}


def test_a_moved_rootdir_finds_its_baseline(pytester: pytest.Pytester) -> None:
    """The issue's case: the first run records before ../baselines exists; once it does,
    pytest counts it among its arguments and the rootdir moves up to the repository."""
    perf = _suite(pytester)
    args = (".", "--distperf-baseline-dir", "../baselines")
    recorded = _run(pytester, perf, *args, "--distperf-update-baselines")
    recorded.assert_outcomes(passed=1)
    recorded.stdout.fnmatch_lines([f"rootdir: {perf}"])
    compared = _run(pytester, perf, *args)
    compared.assert_outcomes(passed=1)
    compared.stdout.fnmatch_lines([f"rootdir: {pytester.path}"])  # it moved
    assert _compared(compared) == {"test_decode[auto-2cpu]": True}
    [test_id] = _entries(pytester.path / "baselines")
    assert test_id.startswith("perf/test_decode.py::test_decode[auto-2cpu] [")
    assert ORPHANS_HEADING not in compared.stdout.str()
    assert "baseline_orphans" not in compared.report


def test_pytest_perf_and_pytest_dot_inside_perf_share_a_baseline(
    pytester: pytest.Pytester,
) -> None:
    perf = _suite(pytester)
    baselines = pytester.mkdir("baselines")
    # no entry for the test, and none left over: nothing more than the test's own note
    first = _run(pytester, perf, ".", f"--distperf-baseline-dir={baselines}")
    assert _compared(first) == {"test_decode[auto-2cpu]": False}
    assert ORPHANS_HEADING not in first.stdout.str()
    assert "baseline_orphans" not in first.report
    from_root = _run(pytester, pytester.path, "perf", "--distperf-baseline-dir", "baselines",
                     "--distperf-update-baselines")  # fmt: skip
    from_root.stdout.fnmatch_lines([f"rootdir: {pytester.path}"])
    inside = _run(pytester, perf, ".", f"--distperf-baseline-dir={baselines}")
    inside.stdout.fnmatch_lines([f"rootdir: {perf}"])  # another rootdir, the same identity
    inside.assert_outcomes(passed=1)
    assert _compared(inside) == {"test_decode[auto-2cpu]": True}
    assert len(_entries(baselines)) == 1


def test_an_entry_stored_under_the_older_identity_is_found_and_moved_with_its_history(
    pytester: pytest.Pytester,
) -> None:
    perf = _suite(pytester, git=False)  # outside git: the rootdir-relative node id, as before
    args = (".", f"--distperf-baseline-dir={pytester.path / 'baselines'}")
    _run(pytester, perf, *args, "--distperf-update-baselines").assert_outcomes(passed=1)
    [legacy] = _entries(pytester.path / "baselines")
    assert legacy.startswith("test_decode.py::test_decode[auto-2cpu] [")
    _git_init(pytester.path)  # now in a repository: the identity is perf/test_decode.py::...
    found = _run(pytester, perf, *args)
    assert _compared(found) == {"test_decode[auto-2cpu]": True}
    assert ORPHANS_HEADING not in found.stdout.str()
    # another run (the same one within a second reads as that run saved twice)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAKE_SLOWDOWN", "1.1")
        _run(pytester, perf, *args, "--distperf-update-baselines").assert_outcomes(passed=1)
    [(moved, entry)] = _entries(pytester.path / "baselines").items()
    assert moved == "perf/" + legacy
    assert len(entry.run_medians) == 2  # the older entry's run, then this one


def test_a_renamed_file_is_named_as_orphan_and_found_after_baselines_rename(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    perf = _suite(pytester, name="test_old")
    baselines = pytester.path / "baselines"
    args = ("perf", f"--distperf-baseline-dir={baselines}")
    _run(pytester, pytester.path, *args, "--distperf-update-baselines").assert_outcomes(passed=1)
    (perf / "test_old.py").rename(perf / "test_new.py")
    orphaned = _run(pytester, pytester.path, *args, "--distperf-strict")
    orphaned.assert_outcomes(failed=1)  # strict: a test without its baseline fails, as before
    assert _compared(orphaned) == {"test_decode[auto-2cpu]": False}
    orphaned.stdout.fnmatch_lines(
        [
            "*no baseline for this test on this machine*",
            f"*{ORPHANS_HEADING}*",
            "1 test(s) found no baseline, while 1 entry of this machine's baseline file "
            f"{baselines}/*.json matches no collected test:",
            "  no baseline:  perf/test_new.py::test_decode[[]auto-2cpu[]] [[]*",
            "  orphaned:     perf/test_old.py::test_decode[[]auto-2cpu[]] [[]*",
            f"  likely: perf/test_old.py::test_decode[[]auto-2cpu[]]: {FILE_RENAMED} "
            "(perf/test_new.py::test_decode[[]auto-2cpu[]])",
            f"  run: distperf baselines rename perf/test_old.py perf/test_new.py {baselines}",
        ]
    )
    assert orphaned.stdout.str().count(ORPHANS_HEADING) == 1
    field = orphaned.report["baseline_orphans"]
    assert [split_identity(t)[0] for t in field["tests_without_baseline"]] == [
        "perf/test_new.py::test_decode[auto-2cpu]"
    ]
    assert [split_identity(t)[0] for t in field["orphaned_entries"]] == [
        "perf/test_old.py::test_decode[auto-2cpu]"
    ]
    assert field["likely_cause"] == FILE_RENAMED
    assert distperf_main(["baselines", "rename", "perf/test_old.py", "perf/test_new.py",
                          str(baselines)]) == 0  # fmt: skip
    assert "perf/test_old.py::test_decode[auto-2cpu] [" in capsys.readouterr().out
    renamed = _run(pytester, pytester.path, *args)
    assert _compared(renamed) == {"test_decode[auto-2cpu]": True}
    assert ORPHANS_HEADING not in renamed.stdout.str()
    assert "baseline_orphans" not in renamed.report


# --- the rules, without a session --------------------------------------------------------------


def test_the_identity_is_the_file_relative_to_its_repository(tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    suite = tmp_path / "repo" / "perf"
    suite.mkdir()
    node = "test_decode.py::test_decode[auto-1cuda]"
    assert repository_nodeid(node, suite) == f"perf/{node}"
    assert repository_nodeid(f"perf/{node}", suite.parent) == f"perf/{node}"
    assert repository_nodeid(f"repo/perf/{node}", tmp_path) == f"perf/{node}"
    # a worktree's .git is a file
    (tmp_path / "repo" / ".git").rmdir()
    (tmp_path / "repo" / ".git").write_text("gitdir: /elsewhere\n")
    assert repository_nodeid(node, suite) == f"perf/{node}"
    outside = tmp_path / "plain"
    outside.mkdir()
    assert repository_nodeid(node, outside) == node  # no repository: pytest's node id


def test_split_identity() -> None:
    assert split_identity("a.py::t[x] [model=m new=1]") == ("a.py::t[x]", "model=m new=1")
    assert split_identity("a.py::t[x]") == ("a.py::t[x]", "")


def test_orphans_name_their_likely_cause() -> None:
    looked_up = {
        "perf/a.py::t[1] [m=x]": ("perf/a.py::t[1] [m=x]", False),  # stored from perf/ before
        "perf/b.py::t[1] [m=x]": ("perf/b.py::t[1] [m=x]", False),  # workload changed
        "perf/c.py::t[1] [m=x]": ("perf/c.py::t[1] [m=x]", True),
    }
    entries = [
        "a.py::t[1] [m=x]",
        "perf/b.py::t[1] [m=y]",
        "perf/c.py::t[1] [m=x]",
        "perf/d.py::gone [m=x]",
        "perf/e.py::deselected [m=x]",
    ]
    found = find_orphans(
        entries, looked_up, ["perf/e.py::deselected"], topology_key="k", baseline_file="f",
        directory="dir",
    )  # fmt: skip
    assert found is not None
    assert found.orphaned_entries == ("a.py::t[1] [m=x]", "perf/b.py::t[1] [m=y]",
                              "perf/d.py::gone [m=x]")  # fmt: skip
    causes = {s.orphan: (s.cause, s.command) for s in found.suggestions}
    assert causes["perf/b.py::t[1] [m=y]"] == (WORKLOAD_CHANGED, None)
    assert causes["a.py::t[1] [m=x]"] == (
        PATH_MOVED, "distperf baselines rename a.py perf/a.py dir"
    )  # fmt: skip
    assert causes["perf/d.py::gone [m=x]"][1] == (
        "distperf baselines prune dir --match perf/d.py::gone"
    )
    # every test found its entry, or no entry is left over: nothing to say
    assert find_orphans(entries, {"perf/c.py::t[1] [m=x]": ("x", True)}, [], topology_key="k",
                        baseline_file="f", directory="d") is None  # fmt: skip
    assert find_orphans(["perf/c.py::t[1] [m=x]"], looked_up, [], topology_key="k",
                        baseline_file="f", directory="d") is None  # fmt: skip
