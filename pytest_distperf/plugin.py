"""pytest hooks of pytest-distperf: options, markers, parametrisation, the fixture, the report.

This module is imported on every pytest start (entry point `pytest11`), so it must stay cheap:
no torch at import time. Everything that needs torch runs inside the rank processes, or is
imported lazily when a distperf test is actually collected.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from .results import RunResult, RunSpec
from .settings import (
    OPTIONS,
    SettingError,
    Settings,
    Workload,
    env_slowdown,
    resolve_settings,
    workload_from_marker,
)
from .strategies import strategy_names

STRATEGY_MARKER = "strategy"
WORKLOAD_MARKER = "distperf"
RESULT_PROPERTY = "distperf"
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distperf", "distributed performance regression tests")
    for spec in OPTIONS:
        group.addoption(spec.flag, dest=f"distperf_{spec.name}", default=None, help=spec.help)
        parser.addini(spec.ini, f"{spec.help} (default {spec.default})", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{STRATEGY_MARKER}(*names): run this distperf test once per parallel strategy; "
        f"names: {', '.join(strategy_names())}",
    )
    config.addinivalue_line(
        "markers",
        f"{WORKLOAD_MARKER}(model='tiny', max_new_tokens=32, prompt_length=8, batch_size=1, "
        "precision='fp32', seed=1234, slowdown=0.0): the workload a distperf test generates",
    )
    cli = {spec.name: config.getoption(f"distperf_{spec.name}") for spec in OPTIONS}
    ini = {spec.name: config.getini(spec.ini) for spec in OPTIONS}
    try:
        settings = resolve_settings(cli, ini, str(config.inipath) if config.inipath else None)
        slowdown = env_slowdown()
    except SettingError as error:
        raise pytest.UsageError(f"pytest-distperf: {error}") from None
    config.pluginmanager.register(DistperfPlugin(settings, slowdown), "distperf-session")


@dataclass
class Resolved:
    accelerator: str
    devices: int
    visible_gpus: int


@dataclass(eq=False)  # hashable: pytest keeps plugins in sets
class DistperfPlugin:
    """Session state, registered in pytest_configure (as pytest-xdist does)."""

    settings: Settings
    slowdown: float | None
    rows: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)  # pytest start, near enough
    # Calibrated once per session (accelerator and device count are fixed for a session) by
    # the first distperf run, at the union of message sizes of every collected test.
    calibration_sizes: Any = None
    calibration: Any = None
    _resolved: Resolved | None = field(default=None, repr=False)

    def resolve(self) -> Resolved:
        """Accelerator and device count for this session; touches torch only on first use."""
        if self._resolved is None:
            visible = _visible_gpus() if self.settings.accelerator != "cpu" else 0
            accelerator = self.settings.accelerator
            if accelerator == "auto":
                accelerator = "cuda" if visible else "cpu"
            devices = self.settings.devices
            if devices is None:  # "auto": all visible GPUs; on CPU, one rank per core
                devices = visible if accelerator == "cuda" and visible else _cpu_count()
            self._resolved = Resolved(accelerator, devices, visible)
        return self._resolved

    @pytest.hookimpl
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "distperf" not in metafunc.fixturenames:
            return
        where = metafunc.definition.nodeid
        names = _strategy_names(metafunc, where)
        _workload_of(metafunc.definition)  # bad marker arguments fail at collection
        resolved = self.resolve()
        ids = [f"{name}-{resolved.devices}{resolved.accelerator}" for name in names]
        metafunc.parametrize("distperf_strategy", names, ids=ids, scope="function")

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        workloads = []
        for item in items:
            strategy = getattr(getattr(item, "callspec", None), "params", {}).get(
                "distperf_strategy"
            )
            if strategy is not None:
                workloads.append((strategy, _workload_of(item)))
        if workloads:
            self.calibration_sizes = session_message_sizes(workloads, self.resolve().devices)

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.settings.json:
            from .report import write_json_report

            write_json_report(self.settings.json, self.rows)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        rows = []
        for key in ("passed", "failed"):
            for report in terminalreporter.stats.get(key, []):
                if getattr(report, "when", None) != "call":
                    continue
                for name, value in report.user_properties:
                    if name == RESULT_PROPERTY:
                        rows.append((report.nodeid, key, value))
        if not rows:
            return
        terminalreporter.write_sep("-", "distperf results")
        for nodeid, outcome, row in rows:
            terminalreporter.write_line(format_result_line(nodeid, outcome, row))


def format_result_line(nodeid: str, outcome: str, row: dict[str, Any]) -> str:
    decode = row.get("decode_tokens_per_sec")
    decode_text = f"{decode:.2f}" if decode is not None else "-"
    return (
        f"{row['tokens_per_sec']:10.2f} tok/s  decode {decode_text:>8} tok/s  "
        f"ttft {row['ttft_s'] * 1000:8.1f} ms  {row['strategy']:<15} "
        f"{row['devices']} x {row['accelerator']:<4}  {outcome.upper():<6} {nodeid}"
    )


def _strategy_names(metafunc: pytest.Metafunc, where: str) -> list[str]:
    names: list[str] = []
    for marker in metafunc.definition.iter_markers(STRATEGY_MARKER):
        if marker.kwargs:
            pytest.fail(
                f"{where}: strategy marker takes names only, got keyword(s) "
                f"{', '.join(marker.kwargs)}",
                pytrace=False,
            )
        names.extend(marker.args)
    if not names:
        names = ["auto"]
    valid = strategy_names()
    for name in names:
        if name not in valid:
            pytest.fail(
                f"{where}: unknown strategy {name!r} in @pytest.mark.strategy; "
                f"valid: {', '.join(valid)}",
                pytrace=False,
            )
    if len(set(names)) != len(names):
        pytest.fail(f"{where}: strategy marker repeats a name: {names}", pytrace=False)
    return names


def session_message_sizes(workloads: list[tuple[str, Workload]], devices: int) -> Any:
    """Union of the message sizes every collected (strategy, workload) really uses."""
    from distperf_model.config import Config

    from .perfmodel import MessageSizes, message_sizes

    gather: set[int] = set()
    reduce: set[int] = set()
    for strategy, workload in workloads:
        if ":" in workload.model:  # a user's builder: its shape is unknown until a rank builds it
            continue
        sizes = message_sizes(
            Config.from_name(workload.model),
            strategy,
            devices,
            DTYPE_BYTES[workload.precision],
            workload.batch_size,
        )
        gather.update(sizes.all_gather)
        reduce.update(sizes.all_reduce)
    if not gather:
        return None
    return MessageSizes(tuple(sorted(gather)), tuple(sorted(reduce)))


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cpu_count() -> int:
    from .launcher import available_cpus

    return available_cpus()


def _known_models() -> tuple[str, ...]:
    from distperf_model.config import PRESETS

    return tuple(PRESETS)


def _workload_of(item: pytest.Item) -> Workload:
    marker = item.get_closest_marker(WORKLOAD_MARKER)
    if marker and marker.args:
        pytest.fail(f"{item.nodeid}: distperf marker takes keyword arguments only", pytrace=False)
    try:
        return workload_from_marker(
            dict(marker.kwargs) if marker else {}, item.nodeid, _known_models()
        )
    except SettingError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)  # outside `except`: no chained duplicate in the report


class DistperfRun:
    """The `distperf` fixture: `run()` launches the test's ranks and returns a RunResult."""

    def __init__(self, item: pytest.Item, plugin: DistperfPlugin, strategy: str) -> None:
        self._item = item
        self._plugin = plugin
        self.strategy = strategy
        workload = _workload_of(item)
        if plugin.slowdown is not None:
            workload = type(workload)(**{**workload.params(), "slowdown": plugin.slowdown})
        self.workload = workload
        self.results: list[RunResult] = []

    @property
    def accelerator(self) -> str:
        """Where this session's ranks run: "cpu" or "cuda"."""
        return self._plugin.resolve().accelerator

    @property
    def devices(self) -> int:
        return self._plugin.resolve().devices

    def spec(self) -> RunSpec:
        resolved = self._plugin.resolve()
        settings = self._plugin.settings
        return RunSpec(
            test_id=self._item.nodeid,
            strategy=self.strategy,
            devices=resolved.devices,
            accelerator=resolved.accelerator,
            workload=self.workload,
            repeats=settings.repeats,
            warmup=settings.warmup,
            timeout=settings.timeout,
            marker_file=os.environ.get("DISTPERF_MARKER_FILE"),
        )

    def run(self) -> RunResult:
        from .launcher import RunFailed, launch

        plugin = self._plugin
        spec = self.spec()
        if plugin.calibration is None and plugin.calibration_sizes is not None:
            spec = dataclasses.replace(spec, calibration_sizes=plugin.calibration_sizes)
        try:
            result = launch(spec)
        except RunFailed as error:
            failure = str(error)
        else:
            if result.calibration is not None:
                plugin.calibration = result.calibration
            self.results.append(result)
            row = result.summary()
            row["calibration"] = plugin.calibration.to_dict() if plugin.calibration else None
            row["session_to_first_timed_s"] = max(r.timed_from for r in result.ranks) - (
                self._plugin.started_at
            )
            self._plugin.rows.append(row)
            self._item.user_properties.append((RESULT_PROPERTY, row))
            return result
        pytest.fail(failure, pytrace=False)


@pytest.fixture
def distperf_strategy(request: pytest.FixtureRequest) -> str:
    """The strategy of this test item (parametrised from @pytest.mark.strategy)."""
    return getattr(request, "param", "auto")


@pytest.fixture
def distperf(request: pytest.FixtureRequest, distperf_strategy: str) -> DistperfRun:
    """Runs the test's model in N ranks under its strategy: `result = distperf.run()`."""
    plugin: DistperfPlugin = request.config.pluginmanager.get_plugin("distperf-session")
    resolved = plugin.resolve()
    if resolved.accelerator == "cuda" and resolved.devices > resolved.visible_gpus:
        pytest.skip(
            f"distperf: {resolved.devices} CUDA devices requested (--distperf-devices) "
            f"but {resolved.visible_gpus} visible"
        )
    return DistperfRun(request.node, plugin, distperf_strategy)
