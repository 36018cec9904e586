"""The store's moves: an entry stored under an older identity taken over with its history, a
locked rewrite of a file (the `distperf baselines` commands), and each recorded run's date and
commit (schema 7)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import filelock
import pytest

from pytest_distperf.store.entry import RUN_HISTORY, BaselineEntry
from pytest_distperf.store.store import BaselineFileError, BaselineStore

KEY = "cpu_x2_loopbackx1_2cpus"
START = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _entry(test_id: str, rate: float, day: int = 0, commit: str | None = None) -> BaselineEntry:
    return BaselineEntry.from_samples(
        test_id, [rate, rate * 1.02, rate * 0.98], None, {}, commit=commit,
        now=START + timedelta(days=day),
    )  # fmt: skip


def test_each_recorded_run_keeps_its_date_and_commit(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for day in range(RUN_HISTORY + 2):
        store.save(KEY, {"t": _entry("t", 100.0 + day, day, commit=f"c{day}")})
        store.save(KEY, {"t": _entry("t", 100.0 + day, day, commit=f"c{day}")})  # once
    entry = store.load(KEY).get("t")
    assert entry is not None and len(entry.run_medians) == RUN_HISTORY
    assert entry.run_commits == tuple(f"c{d}" for d in range(2, RUN_HISTORY + 2))
    assert entry.run_recorded_at[-1] == entry.recorded_at
    assert [datetime.fromisoformat(d).day for d in entry.run_recorded_at] == list(range(3, 13))


def test_a_file_of_another_schema_is_refused_naming_it(tmp_path: Path) -> None:
    data = _entry("t", 100.0, 0, "old").to_dict()
    document = {"schema": 6, "topology_key": KEY, "topology": {}, "entries": {"t": data}}
    path = BaselineStore(tmp_path).path(KEY)
    path.write_text(json.dumps(document))
    with pytest.raises(BaselineFileError, match=f"{path}.*unknown schema version 6"):
        BaselineStore(tmp_path).load(KEY).get("t")
    assert json.loads(path.read_text()) == document  # left as it is


def test_bad_run_records_are_refused() -> None:
    data = _entry("t", 100.0).to_dict()
    for name, value, message in (
        ("run_recorded_at", ["yesterday"], "'yesterday' is not ISO 8601"),
        ("run_commits", [7], "run_commits must be strings or null"),
        ("run_commits", ["a", "b"], "run_commits has 2 values for 1 recorded runs"),
    ):
        with pytest.raises(ValueError, match=message):
            BaselineEntry.from_dict({**data, name: value})


def test_an_entry_under_the_older_identity_moves_to_the_new_one(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save(KEY, {"old": _entry("old", 100.0), "other": _entry("other", 5.0)})
    store.save(KEY, {"new": _entry("new", 110.0, 1)}, moved_from={"new": "old"})
    entries = store.load(KEY)
    assert sorted(entries) == ["new", "other"]
    assert entries["new"].run_medians == (100.0, 110.0)
    # where the new identity has its own entry, the older one is left for `baselines prune`
    store.save(KEY, {"old": _entry("old", 100.0)})
    store.save(KEY, {"new": _entry("new", 120.0, 2)}, moved_from={"new": "old"})
    entries = store.load(KEY)
    assert sorted(entries) == ["new", "old", "other"]
    assert entries["new"].run_medians == (100.0, 110.0, 120.0)
    assert store.find(KEY, "missing", "old") == entries["old"]
    assert store.find(KEY, "missing") is None


def test_rewrite_under_the_lock_removes_an_emptied_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, lock_timeout=0.2)
    store.save(KEY, {"a": _entry("a", 1.0), "b": _entry("b", 2.0)})
    assert sorted(store.rewrite(KEY, lambda e: {k: v for k, v in e.items() if k == "a"})) == ["a"]
    assert sorted(store.load(KEY)) == ["a"]
    with filelock.FileLock(f"{store.path(KEY)}.lock"), pytest.raises(TimeoutError):
        store.rewrite(KEY, lambda e: {})
    assert sorted(store.load(KEY)) == ["a"]
    store.rewrite(KEY, lambda e: {})
    assert not store.path(KEY).exists()
    with pytest.raises(FileNotFoundError, match="no baseline file"):
        store.rewrite(KEY, lambda e: e)


def test_rewrite_never_touches_a_file_it_cannot_parse(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.path(KEY).write_text('{"schema": 7, "entries": ')
    with pytest.raises(BaselineFileError, match="not valid JSON"):
        store.rewrite(KEY, lambda e: {})
    assert store.path(KEY).read_text() == '{"schema": 7, "entries": '
