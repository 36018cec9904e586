"""pytest-xdist (-n): every distperf test runs on one worker (two would measure each other), and
its judged runs ride on its report to the controller. Workers name their distperf items in a
file the controller's scheduler reads: `xdist_group` cannot (pytest-xdist issue #1386)."""

from __future__ import annotations

import copyreg
import io
import json
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

SCOPE = "<distperf ranks>"  # the scheduling scope of every distperf test; no node id looks so
REPORT_KEY = "distperf_payload"  # the test report attribute the payload travels in
MODE_KEY = "distperf_dist"  # the controller's --dist mode, in each worker's workerinput
IDS_KEY = "distperf_ids_dir"  # where workers name their distperf items, in workerinput
UNGROUPED_MODES = ("each", "worksteal")
RECORDS = pytest.StashKey[list[Any]]()  # an item's judged runs not yet sent with a report
ARGNAMES = ("distperf_strategy", "distperf_devices")  # markers.parametrize gives them


def is_distperf(item: pytest.Item) -> bool:
    return ARGNAMES[0] in getattr(getattr(item, "callspec", None), "params", {})


@dataclass(frozen=True)
class Payload:
    """What one test's phase judged on a worker: its runs and the topology they were held to."""

    records: tuple[Any, ...]  # judge.record.JudgedRun
    topology: Any  # topology.Topology, or None when the gate was never made


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def is_controller(config: pytest.Config) -> bool:
    """A distributing xdist session (the process that starts the workers)."""
    if is_worker(config):
        return False
    dist = getattr(config.option, "dist", "no")
    return dist != "no" and bool(getattr(config.option, "tx", None))


def header_line(config: pytest.Config) -> str | None:
    if not is_controller(config):
        return None
    mode = config.option.dist
    if mode in UNGROUPED_MODES:
        return f"pytest-xdist --dist {mode} cannot keep distperf tests on one worker: they fail"
    return f"pytest-xdist --dist {mode}: all distperf tests run on one worker"


def refusal(config: pytest.Config) -> str | None:
    """On a worker: why distperf tests must not run here, or None when they may."""
    if not is_worker(config):
        return None
    workerinput: dict[str, Any] = config.workerinput  # type: ignore[attr-defined]
    mode = workerinput.get(MODE_KEY)
    if mode not in UNGROUPED_MODES or int(workerinput.get("workercount", 1)) <= 1:
        return None
    return (
        f"distperf: under pytest-xdist --dist {mode}, distperf tests would run on several "
        "workers at once and start ranks on the same devices; use --dist load, loadgroup, "
        "loadscope or loadfile (distperf then keeps its tests on one worker), or run without -n"
    )


def plain_nodeid(nodeid: str) -> str:
    """The node id without the `@group` xdist's loadgroup appends before pytest 9.2."""
    at = nodeid.rfind("@")
    if at > nodeid.rfind("]") and at > nodeid.rfind("::"):
        return nodeid[:at]
    return nodeid


def attach(report: pytest.TestReport, payload: Payload) -> None:
    try:
        data: bytes | str = _dumps(payload)
    except Exception as error:  # noqa: BLE001 - the controller says what was lost, and why
        data = f"{report.nodeid}: its distperf results could not be sent: {error!r}"
    setattr(report, REPORT_KEY, data)


def detach(report: pytest.TestReport) -> Payload | str | None:
    """The payload a worker attached; a text when it could not be sent; None without one."""
    data = getattr(report, REPORT_KEY, None)
    # The worker is this session's own process running this package: its pickles are trusted
    # as the rank pool's pipes are.
    return pickle.loads(data) if isinstance(data, bytes) else data


def _dumps(payload: Payload) -> bytes:
    # Frozen dataclasses travel as they are; read-only mappings in them are rebuilt there.
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer)
    pickler.dispatch_table = {
        **copyreg.dispatch_table,
        MappingProxyType: lambda proxy: (read_only, (dict(proxy),)),
    }
    pickler.dump(payload)
    return buffer.getvalue()


def read_only(mapping: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(mapping)  # a function pickle can name (mappingproxy it cannot)


def scheduler(config: pytest.Config, log: Any, ids_dir: Path) -> Any:
    """xdist's scheduler for this --dist mode with the distperf tests as one scope, or None
    (each, worksteal: xdist's own, and the distperf tests fail on the workers)."""
    from xdist.scheduler import LoadFileScheduling, LoadGroupScheduling, LoadScopeScheduling

    # For load, loadgroup's scheduler: ungrouped tests are each their own unit, as under load.
    bases = {
        "load": LoadGroupScheduling,
        "loadgroup": LoadGroupScheduling,
        "loadscope": LoadScopeScheduling,
        "loadfile": LoadFileScheduling,
    }
    base = bases.get(config.getvalue("dist"))
    if base is None:
        return None

    class DistperfScheduling(base):  # type: ignore[misc, valid-type]
        _distperf_ids: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._distperf_ids is None:  # scheduling starts once every worker has collected
                self._distperf_ids = read_ids(ids_dir)
            return SCOPE if nodeid in self._distperf_ids else super()._split_scope(nodeid)

    return DistperfScheduling(config, log)


def write_ids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker, before xdist sends its collection: name the distperf items."""
    directory = config.workerinput.get(IDS_KEY)  # type: ignore[attr-defined]
    if directory is None:
        return
    worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
    path = Path(directory) / f"{worker}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps([item.nodeid for item in items if is_distperf(item)]))
    os.replace(partial, path)  # the controller never reads half a list


def read_ids(directory: Path) -> frozenset[str]:
    ids: set[str] = set()
    for path in directory.glob("*.json"):
        ids.update(json.loads(path.read_text()))
    return frozenset(ids)


class Relay:
    """Under xdist: keeps distperf tests on one worker, carries their runs to the controller."""

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin
        self.ids_dir: Path | None = None
        self.lost: list[str] = []  # results a worker could not send
        if is_controller(plugin.config):
            self.ids_dir = Path(tempfile.mkdtemp(prefix="distperf-xdist-"))

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[MODE_KEY] = self.plugin.config.option.dist
        node.workerinput[IDS_KEY] = str(self.ids_dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        return scheduler(config, log, self.ids_dir) if self.ids_dir is not None else None

    @pytest.hookimpl(tryfirst=True)  # before xdist's worker sends its collection
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if is_worker(session.config):
            write_ids(session.config, session.items)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item) -> Any:
        report = yield
        records = item.stash.get(RECORDS, [])
        if records and is_worker(item.config):
            attach(report, Payload(tuple(records), self.plugin.topology_of_gate()))
        item.stash[RECORDS] = []
        return report

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = detach(report) if is_controller(self.plugin.config) else None
        if isinstance(payload, str):
            self.lost.append(payload)
        elif payload is not None:
            self.plugin.records.extend(payload.records)
            self.plugin.topology = payload.topology or self.plugin.topology

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for text in self.lost:
            terminalreporter.write_line(f"distperf: {text}", red=True)

    @pytest.hookimpl
    def pytest_unconfigure(self) -> None:
        if self.ids_dir is not None:
            shutil.rmtree(self.ids_dir, ignore_errors=True)
