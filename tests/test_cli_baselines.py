"""`distperf baselines list|show|rename|prune|diff` on baseline directories made here (and one
refreshed by a faked session, then diffed against its commit)."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import FAKE_LAUNCH_CONFTEST

from pytest_distperf.cli import main
from pytest_distperf.store.entry import BaselineEntry
from pytest_distperf.store.store import BaselineStore

KEY, OTHER_KEY = "cpu_x2_loopbackx1_2cpus", "cuda_h100_x2_nv18"
DECODE = "perf/test_decode.py::test_decode[auto-2cpu] [model=pythia-14m]"
PREFILL = "perf/test_decode.py::test_prefill[auto-2cpu] [model=pythia-14m]"
TRAIN = "perf/test_train.py::test_step[fsdp-2cpu] [model=pythia-14m]"
NOW = datetime.now(timezone.utc)


def _record(
    directory: Path, test_id: str, rate: float, *, key: str = KEY, days_ago: float = 0.0,
    commit: str | None = None,
) -> None:  # fmt: skip
    """One more recorded run of `test_id`, as --distperf-update-baselines stores it."""
    entry = BaselineEntry.from_samples(
        test_id, [rate, rate * 1.01, rate * 0.99], None, {"torch": "2.13"}, commit=commit,
        now=NOW - timedelta(days=days_ago),
    )  # fmt: skip
    BaselineStore(directory).save(key, {test_id: entry}, {"accelerator": key.split("_")[0]})


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()  # what ran before (a pytester session's own output)
    status = main(["baselines", *args])
    out, err = capsys.readouterr()
    return status, out, err


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    status, out, err = _run(capsys, *args, "--json")
    assert status == 0, err
    return json.loads(out)


@pytest.fixture
def baselines(tmp_path: Path) -> Path:
    directory = tmp_path / "distperf-baselines"
    for run, commit in enumerate(("a" * 40, "b" * 40, "c" * 40)):
        _record(directory, DECODE, 100.0 + run, days_ago=3 - run, commit=commit)
    _record(directory, PREFILL, 500.0, days_ago=40)
    _record(directory, DECODE, 90.0, key=OTHER_KEY)
    return directory


def test_list_shows_each_entry_per_topology_key(
    baselines: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = _json(capsys, "list", str(baselines))
    assert sorted(listed["topology_keys"]) == [KEY, OTHER_KEY]
    rows = {row["test_id"]: row for row in listed["topology_keys"][KEY]}
    decode = rows[DECODE]
    assert decode["test"] == DECODE.split(" [")[0] and decode["workload"] == "model=pythia-14m"
    assert decode["recorded_runs"] == 3 and decode["commit"] == "c" * 40
    assert decode["median_tokens_per_sec"] == 102.0
    assert decode["drift"] == pytest.approx(0.01, rel=0.5)  # medians 100, 101, 102
    assert rows[PREFILL]["drift"] is None  # one run: no drift yet
    assert listed["unreadable"] == []
    monkeypatch.chdir(baselines.parent)  # the default directory: distperf-baselines here
    status, out, _ = _run(capsys, "list")
    assert status == 0
    assert f"{KEY} (2 entries)" in out and f"{OTHER_KEY} (1 entry)" in out
    assert "3 run(s)" in out and "cccccccccccc" in out and "median 102 tok/s" in out


def test_show_gives_each_recorded_run_with_its_date_and_commit(
    baselines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = _json(capsys, "show", "test_decode[auto-2cpu]", str(baselines))
    by_key = {item["topology_key"]: item for item in shown["entries"]}
    runs = by_key[KEY]["runs"]
    assert [r["median_tokens_per_sec"] for r in runs] == [100.0, 101.0, 102.0]
    assert [r["commit"] for r in runs] == ["a" * 40, "b" * 40, "c" * 40]
    dates = [datetime.fromisoformat(r["recorded_at"]) for r in runs]
    assert dates == sorted(dates) and abs(NOW - timedelta(days=1) - dates[-1]) < timedelta(
        minutes=1
    )
    assert len(by_key[OTHER_KEY]["runs"]) == 1
    status, out, _ = _run(capsys, "show", DECODE, str(baselines))
    assert status == 0
    assert "run  3: 102 tok/s" in out and "bbbbbbbbbbbb" in out
    # a part of two tests' ids names neither
    status, _, err = _run(capsys, "show", "test_decode.py", str(baselines))
    assert status == 2
    assert "'test_decode.py' names 2 tests" in err and DECODE in err and PREFILL in err
    status, _, err = _run(capsys, "show", "test_nothing", str(baselines))
    assert status == 2 and "no entry in" in err and "'test_nothing'" in err


def test_rename_a_moved_file_keeps_the_history(
    baselines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = _run(capsys, "rename", "perf/test_decode.py", "perf/gen/test_gen.py",
                          str(baselines))  # fmt: skip
    assert status == 0
    assert f"{KEY}: {DECODE} -> perf/gen/test_gen.py::test_decode" in out
    entries = BaselineStore(baselines).load(KEY)
    assert sorted(entries) == [
        "perf/gen/test_gen.py::test_decode[auto-2cpu] [model=pythia-14m]",
        "perf/gen/test_gen.py::test_prefill[auto-2cpu] [model=pythia-14m]",
    ]
    moved = entries["perf/gen/test_gen.py::test_decode[auto-2cpu] [model=pythia-14m]"]
    assert moved.run_medians == (100.0, 101.0, 102.0)
    assert moved.test_id.startswith("perf/gen/")
    assert list(BaselineStore(baselines).load(OTHER_KEY)) == [
        "perf/gen/test_gen.py::test_decode[auto-2cpu] [model=pythia-14m]"
    ]


def test_rename_refuses_to_replace_an_entry_and_writes_nothing(
    baselines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.read_bytes() for p in baselines.iterdir()}
    status, _, err = _run(capsys, "rename", DECODE, PREFILL, str(baselines))
    assert status == 2 and f"{PREFILL!r} exists already" in err
    status, _, err = _run(capsys, "rename", "perf/nothing", "x", str(baselines))
    assert status == 2 and "no entry in" in err and "'perf/nothing'" in err
    assert {p.name: p.read_bytes() for p in baselines.iterdir()} == before


def test_prune_lists_and_removes_only_with_apply(
    baselines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.read_bytes() for p in baselines.iterdir()}
    dry = _json(capsys, "prune", str(baselines), "--older-than", "30")
    assert dry["applied"] is False and dry["entries"] == {KEY: [PREFILL]}
    status, out, _ = _run(capsys, "prune", str(baselines), "--older-than", "30")
    assert status == 0 and "would be removed (pass --apply" in out and PREFILL in out
    assert {p.name: p.read_bytes() for p in baselines.iterdir()} == before
    applied = _json(capsys, "prune", str(baselines), "--older-than", "30", "--apply")
    assert applied["applied"] is True and applied["entries"] == {KEY: [PREFILL]}
    assert sorted(BaselineStore(baselines).load(KEY)) == [DECODE]
    # a pattern: a part of the id as written (brackets included), or a shell pattern
    assert _json(capsys, "prune", str(baselines), "--match", "[auto-2cpu]")["entries"] == {
        KEY: [DECODE], OTHER_KEY: [DECODE]
    }  # fmt: skip
    assert _json(capsys, "prune", str(baselines), "--match", "perf/*_decode.py::*")["entries"]
    _json(capsys, "prune", str(baselines), "--match", DECODE, "--apply")
    assert list(baselines.glob("*.json")) == []  # a file with no entry left is removed


def test_prune_needs_one_rule(baselines: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in ([], ["--older-than", "3", "--match", "x"], ["--older-than", "soon"]):
        with pytest.raises(SystemExit) as info:
            main(["baselines", "prune", str(baselines), *args])
        assert info.value.code == 2
    assert "--older-than" in capsys.readouterr().err


def test_an_unparseable_file_is_named_and_left_untouched(
    baselines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = baselines / f"{OTHER_KEY}.json"
    text = broken.read_bytes()[:-30]  # truncated, as a bad merge or a full disk leaves it
    broken.write_bytes(text)
    for args in (["list"], ["rename", "perf/test_decode.py", "perf/x.py"],
                 ["prune", "--match", "test_decode", "--apply"]):  # fmt: skip
        status, _, err = _run(capsys, *args, str(baselines))
        assert status == 1, args
        assert f"baseline file {broken}: not valid JSON" in err and "(left as it is)" in err
        assert broken.read_bytes() == text
    # the readable file was renamed, then pruned
    assert BaselineStore(baselines).keys() == [KEY, OTHER_KEY]
    assert sorted(BaselineStore(baselines).load(KEY)) == [PREFILL.replace("test_decode", "x")]


def test_a_missing_directory_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _run(capsys, "list", str(tmp_path / "nowhere"))
    assert status == 2 and f"{tmp_path / 'nowhere'}: no such baseline directory" in err


def test_diff_of_two_directories(baselines: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = baselines.parent / "old"
    subprocess.run(["cp", "-r", str(baselines), str(old)], check=True)
    _record(baselines, DECODE, 80.0)  # refreshed slower
    _record(baselines, TRAIN, 10.0)  # a new test
    BaselineStore(baselines).rewrite(OTHER_KEY, lambda entries: {})  # a machine gone
    rows = {(r["topology_key"], r["test_id"]): r for r in
            _json(capsys, "diff", str(old), str(baselines))["tests"]}  # fmt: skip
    changed = rows[KEY, DECODE]
    assert changed["status"] == "changed"
    assert (changed["old_median_tokens_per_sec"], changed["new_median_tokens_per_sec"]) == (
        102.0, 80.0
    )  # fmt: skip
    assert changed["change"] == pytest.approx(80 / 102 - 1)
    assert (changed["old_runs"], changed["new_runs"]) == (3, 4)
    assert rows[KEY, TRAIN]["status"] == "added" and rows[OTHER_KEY, DECODE]["status"] == "removed"
    assert rows[KEY, PREFILL]["status"] == "unchanged"
    status, out, _ = _run(capsys, "diff", str(old), str(baselines))
    assert status == 0
    assert "3 of 4 entries differ" in out
    assert f"changed  {KEY}: {DECODE}" in out and "median 102 -> 80 tok/s (-21.6%)" in out
    assert PREFILL not in out  # unchanged: counted, not listed
    status, out, _ = _run(capsys, "diff", "--markdown", str(old), str(baselines))
    assert f"| changed | `{KEY}` | `{DECODE}` | 102 | 80 | -21.6% | 3 → 4 | - (same) |" in out


def _git(cwd: Path, *args: str) -> None:
    environ = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}  # fmt: skip
    subprocess.run(["git", *args], cwd=cwd, check=True, env=environ, timeout=30,
                   capture_output=True)  # fmt: skip


def test_diff_of_a_refresh_against_its_commit(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The refresh pull request's summary: the suite recorded and committed, then refreshed
    by a slower session (the launcher faked), diffed as `HEAD:DIR` against the files."""
    _git(pytester.path, "init", "-q")
    pytester.makeconftest(FAKE_LAUNCH_CONFTEST)
    pytester.makepyfile(test_decode="""
        import pytest

        @pytest.mark.strategy("auto", "fsdp")
        @pytest.mark.distperf(model="pythia-14m", max_new_tokens=12)
        def test_decode(distperf):
            distperf.run()
    """)  # fmt: skip
    args = ("--distperf-accelerator=cpu", "--distperf-devices=2", "-p", "no:benchmark",
            "--distperf-baseline-dir=baselines", "--distperf-update-baselines")  # fmt: skip
    pytester.runpytest(*args).assert_outcomes(passed=2)
    _git(pytester.path, "add", "baselines")
    _git(pytester.path, "commit", "-q", "-m", "baselines")
    status, _, _ = _run(capsys, "diff", "HEAD:baselines", "baselines")
    assert status == 0
    monkeypatch.setenv("FAKE_SLOWDOWN", "1.25")
    pytester.runpytest(*args).assert_outcomes(passed=2)
    diff = _json(capsys, "diff", "HEAD:baselines", "baselines")
    assert diff["old"] == "HEAD:baselines"
    assert {r["status"] for r in diff["tests"]} == {"changed"} and len(diff["tests"]) == 2
    for row in diff["tests"]:
        assert row["new_median_tokens_per_sec"] == pytest.approx(
            row["old_median_tokens_per_sec"] / 1.25, rel=1e-3
        )
    status, out, _ = _run(capsys, "diff", "--markdown", "HEAD:baselines", "baselines")
    assert out.count("| changed |") == 2 and "-20.0%" in out
    # before the first baselines are committed: every entry is new, and a note says why
    first = _json(capsys, "diff", "HEAD:elsewhere", "baselines")
    assert {r["status"] for r in first["tests"]} == {"added"}
    assert first["notes"] == ["HEAD:elsewhere: no such directory at HEAD"]
    status, _, err = _run(capsys, "diff", "nosuchref:baselines", "baselines")
    assert status == 2 and "'nosuchref' is not a commit" in err
