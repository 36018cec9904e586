from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import filelock
import pytest

from pytest_distperf.store.entry import RUN_HISTORY, SCHEMA, BaselineEntry
from pytest_distperf.store.store import BaselineFileError, BaselineStore, validate_topology_key

KEY = "cuda-H200x4-nvlink"
WHEN = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def make_entry(test_id: str = "tests/test_perf.py::test_fsdp[fsdp-4]", scale: float = 1.0):
    return BaselineEntry.from_samples(
        test_id,
        [1001.23456789 * scale, 990.5 * scale, 1010.0 * scale, 1003.0 * scale, 998.0 * scale],
        peak_memory_bytes=3 * 1024**3,
        versions={"torch": "2.13.0", "lightning": "2.6.0"},
        commit="abc1234",
        now=WHEN,
        extra={"predicted_tok_s": 1500.0, "bound": "weights streaming"},
    )


# --- entries -----------------------------------------------------------------------------------


def test_from_samples_computes_summary() -> None:
    entry = make_entry()
    assert entry.n == 5
    assert entry.samples[0] == 1001.23  # six significant digits keep diffs short
    assert entry.median == 1001.23
    assert 0 < entry.dispersion < 0.02
    assert entry.stdev > 0
    assert entry.recorded_at == "2025-01-02T03:04:05+00:00"
    assert list(entry.versions) == ["lightning", "torch"]
    single = BaselineEntry.from_samples("t", [5.0], None, {}, now=WHEN)
    assert (single.dispersion, single.stdev, single.peak_memory_bytes) == (0.0, 0.0, None)


def test_entry_is_immutable_and_hashable() -> None:
    entry = make_entry()
    with pytest.raises(AttributeError):
        entry.median = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        entry.versions["torch"] = "0"  # type: ignore[index]
    assert hash(entry) == hash(make_entry())
    assert entry == BaselineEntry.from_dict(entry.to_dict())
    assert json.loads(json.dumps(entry.to_dict())) == entry.to_dict()


@pytest.mark.parametrize(
    ("samples", "kwargs", "match"),
    [
        ([], {}, "no samples"),
        ([0.0], {}, "positive"),
        ([float("nan")], {}, "positive"),
        ([1.0], {"extra": {"x": object()}}, "JSON"),
    ],
)
def test_from_samples_rejects_bad_input(samples, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        BaselineEntry.from_samples("t", samples, None, {}, **{"now": WHEN, **kwargs})


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("peak_memory_bytes", -1, "t: peak_memory_bytes must be a non-negative int or None"),
        ("commit", 7, "t: commit must be a string or None"),
        ("versions", {"torch": 2}, "t: versions must map package names to version strings"),
        ("stdev", -0.5, "t: stdev must be a non-negative number"),
    ],
)
def test_a_stored_entry_with_a_bad_field_is_refused_by_name(field, value, match) -> None:
    stored = make_entry().to_dict() | {"test_id": "t", field: value}
    with pytest.raises(ValueError, match=match):
        BaselineEntry.from_dict(stored)


# --- store -------------------------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    entry = make_entry()
    path = store.save(KEY, {entry.test_id: entry}, topology={"gpus": 4, "link": "NV18"})
    assert path == tmp_path / "baselines" / f"{KEY}.json"
    assert store.load(KEY) == {entry.test_id: entry}
    assert store.load(KEY).get(entry.test_id) == entry
    assert store.load(KEY).get("other") is None
    assert json.loads(store.path(KEY).read_text())["topology"] == {"gpus": 4, "link": "NV18"}
    document = json.loads(path.read_text())
    assert document["schema"] == SCHEMA == 7
    assert document["topology_key"] == KEY


def test_missing_file_loads_empty(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "nothing-here")
    assert store.load(KEY) == {}
    assert store.load(KEY).get("t") is None
    assert store.keys() == []


def test_formatting_is_sorted_and_stable(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    a, b = make_entry("b-test"), make_entry("a-test", 2.0)
    path = store.save(KEY, {a.test_id: a, b.test_id: b})
    first = path.read_bytes()
    store.save(KEY, {b.test_id: b, a.test_id: a})
    assert path.read_bytes() == first
    text = first.decode()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text.index('"a-test"') < text.index('"b-test"')
    assert '\n  "entries": {\n' in text  # indent=2
    other = BaselineStore(tmp_path / "other")
    other.save(KEY, {b.test_id: b})
    other.save(KEY, {a.test_id: a})
    assert other.path(KEY).read_bytes() == first


def test_save_merges_and_keeps_other_entries(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    a, b = make_entry("a"), make_entry("b")
    store.save(KEY, {"a": a}, topology={"gpus": 4})
    store.save(KEY, {"b": b})
    assert store.load(KEY) == {"a": a, "b": b}
    assert json.loads(store.path(KEY).read_text())["topology"] == {"gpus": 4}  # kept when not given
    faster = make_entry("a", 1.5)
    store.save(KEY, {"a": faster})
    assert store.load(KEY) == {"a": faster.following(a), "b": b}
    assert store.load(KEY)["a"].run_medians == (a.median, faster.median)
    store.save("cpu-gloo-x2", {"a": a})
    assert store.load(KEY)["a"].samples == faster.samples


def test_refreshes_build_a_capped_history_of_run_medians(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    runs = [make_entry("t", 1.0 + i / 100) for i in range(RUN_HISTORY + 3)]
    for entry in runs:
        store.save(KEY, {"t": entry})
        store.save(KEY, {"t": entry})  # the same run saved twice is one run
    stored = store.load(KEY).get("t")
    assert stored is not None and stored.samples == runs[-1].samples
    assert stored.run_medians == tuple(e.median for e in runs[-RUN_HISTORY:])


@pytest.mark.parametrize("schema", [1, 6])
def test_a_file_of_an_older_schema_is_refused_naming_it(tmp_path: Path, schema: int) -> None:
    store = BaselineStore(tmp_path)
    document = {"schema": schema, "topology_key": KEY, "topology": {}, "entries": {}}
    store.path(KEY).write_text(json.dumps(document))
    with pytest.raises(BaselineFileError) as info:
        store.load(KEY).get("t")
    assert str(store.path(KEY)) in str(info.value)
    assert f"schema version {schema}" in str(info.value) and "reads schema 7" in str(info.value)
    with pytest.raises(BaselineFileError):  # never overwritten
        store.save(KEY, {"t": make_entry("t")})
    assert json.loads(store.path(KEY).read_text()) == document


def _with_relative(
    test_id: str, relative: list[float], scale: float = 1.0, host: tuple[float, ...] = ()
) -> BaselineEntry:
    entry = make_entry(test_id, scale)
    return BaselineEntry.from_samples(
        entry.test_id,
        entry.samples,
        peak_memory_bytes=entry.peak_memory_bytes,
        versions=entry.versions,
        now=WHEN,
        relative_samples=relative,
        host_loop_samples=host,
    )


def test_relative_speed_round_trips_and_keeps_its_own_history(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    first = _with_relative("t", [0.31, 0.3, 0.32])
    store.save(KEY, {"t": first})
    assert store.load(KEY).get("t") == first
    assert first.relative_run_medians == (0.31,)
    second = _with_relative("t", [0.28, 0.27, 0.29], 1.1)
    store.save(KEY, {"t": second})
    store.save(KEY, {"t": second})  # the same run saved twice is one run
    assert store.load(KEY).get("t").relative_run_medians == (0.31, 0.28)
    assert store.load(KEY).get("t").run_medians == (first.median, second.median)
    # A refresh without a bare model (its copy did not fit, say) breaks that history.
    store.save(KEY, {"t": make_entry("t", 1.2)})
    stored = store.load(KEY).get("t")
    assert stored.relative_samples == () and stored.relative_run_medians == ()
    assert len(stored.run_medians) == 3


def test_host_loop_keeps_a_history_of_run_medians(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    first = _with_relative("t", [0.3], host=(0.013, 0.012, 0.023))
    assert first.host_loop_run_medians == (0.013,)
    store.save(KEY, {"t": first})
    assert store.load(KEY).get("t") == first
    second = _with_relative("t", [0.3], 1.1, host=(0.022, 0.024))
    store.save(KEY, {"t": second})
    store.save(KEY, {"t": second})  # the same run saved twice is one run
    assert store.load(KEY).get("t").host_loop_run_medians == (0.013, 0.023)
    store.save(KEY, {"t": _with_relative("t", [0.3], 1.2)})  # a run without the loop
    assert store.load(KEY).get("t").host_loop_run_medians == ()


def test_bad_host_loop_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="host_loop_samples must be positive numbers, got -1"):
        _with_relative("t", [0.5], host=(0.01, -1))
    # The same history edited by hand in a baseline file.
    data = _with_relative("t", [0.5], host=(0.01,)).to_dict()
    data["host_loop_run_medians"] = "0.01"
    with pytest.raises(
        ValueError, match="field 'host_loop_run_medians' must be a list, got '0.01'"
    ):
        BaselineEntry.from_dict(data)
    data["host_loop_run_medians"] = [0.01, 0]
    with pytest.raises(ValueError, match="host_loop_run_medians must be positive numbers, got 0"):
        BaselineEntry.from_dict(data)


def test_bad_relative_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="relative_samples must be positive numbers, got 0.0"):
        _with_relative("t", [0.3, 0.0])
    data = _with_relative("t", [0.3]).to_dict()
    data["relative_run_medians"] = {"a": 1}
    with pytest.raises(ValueError, match="field 'relative_run_medians' must be a list"):
        BaselineEntry.from_dict(data)


def test_bad_run_medians_are_refused() -> None:
    data = make_entry("t").to_dict()
    data["run_medians"] = [100.0, -1.0]
    with pytest.raises(ValueError, match="run_medians must be positive numbers, got -1.0"):
        BaselineEntry.from_dict(data)
    data["run_medians"] = "100"
    with pytest.raises(ValueError, match="field 'run_medians' must be a list"):
        BaselineEntry.from_dict(data)


def test_save_checks_entries(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    with pytest.raises(ValueError, match="BaselineEntry of that test_id"):
        store.save(KEY, {"x": make_entry("y")})
    with pytest.raises(ValueError, match="BaselineEntry"):
        store.save(KEY, {"x": {"median": 1.0}})  # type: ignore[dict-item]
    assert not store.path(KEY).exists()


def test_keys(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    assert store.keys() == []
    store.save("b-key", {"t": make_entry("t")})
    store.save("a-key", {"t": make_entry("t")})
    (tmp_path / "notes.txt").write_text("not a baseline")
    (tmp_path / ".a-key.json.xyz.tmp").write_text("{")
    (tmp_path / "c-key.json.lock").write_text("")
    assert store.keys() == ["a-key", "b-key"]


@pytest.mark.parametrize(
    "key", ["../escape", "a/b", "a\\b", "", ".hidden", "has space", "x" * 201, "a..b", "é"]
)
def test_bad_topology_key(tmp_path: Path, key: str) -> None:
    store = BaselineStore(tmp_path / "store")
    with pytest.raises(ValueError, match="topology key"):
        store.save(key, {"t": make_entry("t")})
    with pytest.raises(ValueError, match="topology key"):
        store.load(key)
    with pytest.raises(ValueError, match="topology key"):
        validate_topology_key(key)
    assert not (tmp_path / "store").exists()
    assert list(tmp_path.iterdir()) == []


def test_good_topology_keys() -> None:
    for key in ("cuda-H200x8-nvlink", "cpu_gloo.2", "a+b", "0"):
        assert validate_topology_key(key) == key


# --- bad files ---------------------------------------------------------------------------------


def _valid_document() -> dict:
    entry = make_entry("t")
    return {
        "schema": SCHEMA,
        "topology_key": KEY,
        "topology": {},
        "entries": {"t": entry.to_dict()},
    }


def _corrupt(kind: str) -> str:
    doc = _valid_document()
    valid = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if kind == "truncated":
        return valid[: len(valid) // 2]
    if kind == "empty":
        return ""
    if kind == "not-json":
        return "<<<<<<< HEAD\nthis is not json\n"
    if kind == "schema-99":
        doc["schema"] = 99
    elif kind == "schema-true":
        doc["schema"] = True  # equal to 1 in Python, but not a schema number
    elif kind == "no-schema":
        del doc["schema"]
    elif kind == "top-level-list":
        return "[1, 2, 3]\n"
    elif kind == "entries-list":
        doc["entries"] = [doc["entries"]["t"]]
    elif kind == "entry-missing-field":
        del doc["entries"]["t"]["samples"]
    elif kind == "entry-bad-sample":
        doc["entries"]["t"]["samples"][0] = "fast"
    elif kind == "median-mismatch":
        doc["entries"]["t"]["median"] = 1.0
    elif kind == "other-topology":
        doc["topology_key"] = "cpu-gloo-x2"
    elif kind == "unknown-field":
        doc["surprise"] = True
    elif kind == "duplicate-test-id":
        text = json.dumps(doc, indent=2, sort_keys=True)
        entry = json.dumps(doc["entries"]["t"])
        return text.replace('"entries": {', f'"entries": {{"t": {entry},', 1)
    elif kind == "nan":
        return valid.replace('"median": 1001.23', '"median": NaN')
    return json.dumps(doc, indent=2)


CORRUPTIONS = [
    "truncated",
    "empty",
    "not-json",
    "schema-99",
    "schema-true",
    "no-schema",
    "top-level-list",
    "entries-list",
    "entry-missing-field",
    "entry-bad-sample",
    "median-mismatch",
    "other-topology",
    "unknown-field",
    "duplicate-test-id",
    "nan",
]


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_bad_file_raises_and_is_never_overwritten(tmp_path: Path, kind: str) -> None:
    store = BaselineStore(tmp_path, lock_timeout=5)
    path = store.path(KEY)
    path.write_text(_corrupt(kind))
    before = path.read_bytes()
    for action in (
        lambda: store.load(KEY),
        lambda: store.load(KEY).get("t"),
        lambda: store.save(KEY, {"new": make_entry("new")}),
        lambda: store.save(KEY, {}),
    ):
        with pytest.raises(BaselineFileError) as info:
            action()
        assert str(path) in str(info.value)
        assert info.value.path == path
        assert isinstance(info.value, ValueError)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [path.name]


def test_bad_file_messages_name_the_problem(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store.path(KEY)
    expected = {
        "truncated": "not valid JSON",
        "empty": "empty",
        "schema-99": "unknown schema version 99",
        "schema-true": "unknown schema version True",
        "median-mismatch": "does not match",
        "other-topology": "'cpu-gloo-x2'",
        "duplicate-test-id": "appears twice",
        "entries-list": "field 'entries' must be a JSON object, got",
        "entry-missing-field": r"entry 't': entry fields: missing \['samples'\]",
    }
    for kind, fragment in expected.items():
        path.write_text(_corrupt(kind))
        with pytest.raises(BaselineFileError, match=fragment):
            store.load(KEY)


def test_valid_document_helper_is_valid(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.path(KEY).write_text(json.dumps(_valid_document()))
    assert set(store.load(KEY)) == {"t"}


def test_lock_timeout_raises(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, lock_timeout=0.2)
    holder = filelock.FileLock(f"{store.path(KEY)}.lock")
    with holder, pytest.raises(TimeoutError, match="could not lock"):
        store.save(KEY, {"t": make_entry("t")})
    assert not store.path(KEY).exists()


# --- processes ---------------------------------------------------------------------------------
# Worker functions live at module level so that spawned children can import them.


def _concurrent_writer(directory: str, writer: int, rounds: int) -> None:
    store = BaselineStore(directory, lock_timeout=30)
    test_id = f"tests/test_perf.py::test_gen[writer{writer}]"
    for round_ in range(rounds):
        entry = BaselineEntry.from_samples(
            test_id, [100.0 + round_, 101.0 + round_, 99.0 + round_], None, {"w": str(writer)}
        )
        store.save(KEY, {test_id: entry})
        # Readers take no lock: atomic replaces must make every read whole and current.
        stored = store.load(KEY).get(test_id)
        assert stored is not None and stored.samples == entry.samples
        assert stored.run_medians[-1] == entry.median


@pytest.mark.slow
def test_concurrent_writers_keep_every_entry(tmp_path: Path) -> None:
    writers, rounds = 4, 25
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_concurrent_writer, args=(str(tmp_path), w, rounds))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * writers
    entries = BaselineStore(tmp_path).load(KEY)
    assert len(entries) == writers
    for w in range(writers):
        entry = entries[f"tests/test_perf.py::test_gen[writer{w}]"]
        assert entry.median == 100.0 + rounds - 1
        assert dict(entry.versions) == {"w": str(w)}
        # every round landed in the history, in order: no refresh lost to another writer
        assert entry.run_medians == tuple(100.0 + r for r in range(rounds - RUN_HISTORY, rounds))
    assert not list(tmp_path.glob("*.tmp"))


def _writer_stuck_before_replace(directory: str, marker: str) -> None:
    def stall(src: object, dst: object) -> None:
        Path(marker).write_text(str(src))
        time.sleep(120)  # the parent kills us here: temp file written, target not replaced

    os.replace = stall  # type: ignore[assignment]
    store = BaselineStore(directory)
    store.save(KEY, {"t": make_entry("t", 0.5), "new": make_entry("new")})


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_writer_killed_mid_write_leaves_old_file_and_no_stale_lock(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, lock_timeout=10)
    old = make_entry("t")
    path = store.save(KEY, {"t": old})
    before = path.read_bytes()
    marker = tmp_path / "marker"

    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_writer_stuck_before_replace, args=(str(tmp_path), str(marker)))
    child.start()
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.is_alive(), f"writer exited early with {child.exitcode}"
            assert time.monotonic() < deadline, "writer never reached os.replace"
            time.sleep(0.02)
        temp = Path(marker.read_text())
        assert temp.exists() and temp.parent == tmp_path
        # The child really holds the lock at this point ...
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(f"{path}.lock", timeout=0.1).acquire()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=10)
    assert child.exitcode == -signal.SIGKILL

    # ... and its death leaves the old file whole and the lock free.
    assert path.read_bytes() == before
    assert store.load(KEY) == {"t": old}
    newer = make_entry("t", 1.1)
    started = time.monotonic()
    store.save(KEY, {"t": newer})
    assert time.monotonic() - started < 5
    assert store.load(KEY) == {"t": newer.following(old)}
    assert not temp.exists()  # the dead writer's temp file is cleaned up under the lock


# --- the counted work and the per-token times (schema 5) ---------------------------------------


def _work():
    from pytest_distperf.work import CollectiveCount, PhaseWork, Work

    decode = PhaseWork({"all_gather": CollectiveCount(16, 5.3e9)}, ops=1200, flops=1.4e10)
    return Work(decode, decode)


def test_an_entry_keeps_the_counted_work_and_the_per_token_times() -> None:
    entry = BaselineEntry.from_samples(
        "t", [5.0, 6.0], None, {}, now=WHEN, work=_work(), device_time_per_token_s=0.0123456789
    )
    assert entry.work == _work()
    assert entry.device_time_run_medians == (0.0123457,)
    data = json.loads(json.dumps(entry.to_dict()))
    collectives = data["work"]["decode"]["collectives"]
    assert collectives["all_gather"] == {"calls": 16, "bytes": 5300000000}
    assert BaselineEntry.from_dict(data) == entry
    assert hash(entry) == hash(BaselineEntry.from_dict(data))
    later = BaselineEntry.from_samples(
        "t", [5.5, 6.0], None, {}, now=WHEN, device_time_per_token_s=1e-3
    ).following(entry)
    assert later.device_time_run_medians == (0.0123457, 0.001)
    assert later.work is None  # the latest run's counts, never an older run's
    assert later.following(later) == later  # the same run saved twice: one run


def test_bad_work_in_an_entry_names_the_entry_and_the_field() -> None:
    data = make_entry().to_dict()
    data["work"] = _work().to_json()
    data["work"]["decode"]["ops"] = "many"
    with pytest.raises(ValueError) as info:
        BaselineEntry.from_dict(data)
    assert str(info.value) == (
        "baseline entry 'tests/test_perf.py::test_fsdp[fsdp-4]': work.decode: field 'ops' must "
        "be a number, got 'many'"
    )
    data = make_entry().to_dict()
    data["device_time_run_medians"] = [0.0]
    with pytest.raises(ValueError, match="device_time_run_medians must be positive numbers"):
        BaselineEntry.from_dict(data)
