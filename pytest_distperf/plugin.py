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
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf.options import (
    OPTIONS,
    SettingError,
    Settings,
    env_slowdown,
    gate_from_marker,
    resolve_settings,
    workload_from_marker,
)
from pytest_distperf.spec import RunResult, RunSpec, Workload
from pytest_distperf.strategies import strategy_names

STRATEGY_MARKER = "strategy"
WORKLOAD_MARKER = "distperf"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distperf", "distributed performance regression tests")
    for spec in OPTIONS:
        dest = f"distperf_{spec.name}"
        if spec.is_flag:
            group.addoption(spec.flag, dest=dest, action="store_true", help=spec.help)
            # a string, not type="bool": pytest's own bool parsing fails without naming the option
            parser.addini(spec.ini, f"{spec.help} (true/false)", default="")
        else:
            group.addoption(spec.flag, dest=dest, default=None, help=spec.help)
            parser.addini(spec.ini, f"{spec.help} (default {spec.default or 'unset'})", default="")


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
    ini = {spec.name: config.getini(spec.ini) or None for spec in OPTIONS}
    try:
        settings = resolve_settings(cli, ini, str(config.inipath) if config.inipath else None)
        slowdown = env_slowdown()
    except SettingError as error:
        raise pytest.UsageError(f"pytest-distperf: {error}") from None
    for name in ("json", "benchmark_json"):  # fail now, not after an hour of tests
        path = getattr(settings, name)
        if path:
            try:
                Path(path).resolve().parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                flag = f"--distperf-{name.replace('_', '-')}"
                raise pytest.UsageError(
                    f"pytest-distperf: {flag} {path}: cannot create its directory: {error}"
                ) from None
    from pytest_distperf.launch.elastic import launched_job

    try:
        job = launched_job()
    except ValueError as error:
        raise pytest.UsageError(f"pytest-distperf: {error}") from None
    plugin = DistperfPlugin(settings, slowdown, rootpath=config.rootpath, job=job)
    config.pluginmanager.register(plugin, "distperf-session")


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
    rootpath: Path = field(default_factory=Path.cwd)
    rows: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)  # pytest start, near enough
    # Calibrated once per session (accelerator and device count are fixed for a session) by
    # the first distperf run, at the union of message sizes of every collected test.
    calibration_sizes: Any = None
    calibration: Any = None
    _gate: Any = field(default=None, repr=False)
    job: Any = None  # launcher.LaunchedJob when pytest runs inside a torchrun/SLURM job

    @property
    def writes_files(self) -> bool:
        """Only rank 0 of a launched job writes reports and baselines."""
        return self.job is None or self.job.rank == 0

    _resolved: Resolved | None = field(default=None, repr=False)

    def resolve(self) -> Resolved:
        """Accelerator and device count for this session; touches torch only on first use."""
        if self._resolved is None:
            visible = _visible_gpus() if self.settings.accelerator != "cpu" else 0
            accelerator = self.settings.accelerator
            if accelerator == "auto":
                accelerator = "cuda" if visible else "cpu"
            devices = self.settings.devices
            if self.job is not None:
                devices = self.job.world_size  # the job's ranks are the test's ranks
            elif devices is None:  # "auto": all visible GPUs; on CPU, one rank per core
                devices = visible if accelerator == "cuda" and visible else _cpu_count()
            if self.job is not None and accelerator == "cuda":
                visible = devices  # one GPU per rank, each rank sees its own
            self._resolved = Resolved(accelerator, devices, visible)
        return self._resolved

    def gate(self) -> Any:
        """The session's judge (topology probed or loaded once, baseline store), on first use."""
        if self._gate is None:
            from pytest_distperf.judge.gate import Gate, current_commit, default_baseline_dir
            from pytest_distperf.store.baseline import BaselineStore
            from pytest_distperf.topology import TopologyError, load_topology, probe

            resolved = self.resolve()
            if self.settings.topology:
                try:
                    topology = load_topology(self.settings.topology, resolved.devices)
                except TopologyError as error:
                    raise pytest.UsageError(
                        f"pytest-distperf: --distperf-topology: {error}"
                    ) from None
                if topology.accelerator != resolved.accelerator:
                    raise pytest.UsageError(
                        f"pytest-distperf: --distperf-topology {self.settings.topology} "
                        f"describes {topology.accelerator} devices but the ranks run on "
                        f"{resolved.accelerator}"
                    )
            else:
                topology = probe(resolved.accelerator, resolved.devices)
            directory = self.settings.baseline_dir or default_baseline_dir(self.rootpath)
            self._gate = Gate(
                topology=topology,
                store=BaselineStore(directory),
                update=self.settings.update_baselines,
                writes=self.writes_files,
                commit=current_commit(self.rootpath) if self.settings.update_baselines else None,
            )
        return self._gate

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
            from pytest_distperf.judge.gate import session_message_sizes

            self.calibration_sizes = session_message_sizes(workloads, self.resolve().devices)
            self.gate()  # a bad --distperf-topology is a usage error before any rank starts

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.writes_files:
            return
        if self.settings.json:
            from pytest_distperf.output.report import write_json_report

            write_json_report(self.settings.json, self.rows)
        if self.settings.benchmark_json:
            from pytest_distperf.output.benchmark_json import (
                default_commit_info,
                write_benchmark_json,
            )

            write_benchmark_json(
                self.settings.benchmark_json,
                self.rows,
                commit_info=default_commit_info(self.rootpath),
            )

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        rows = []
        for key in ("passed", "failed"):
            for report in terminalreporter.stats.get(key, []):
                if getattr(report, "when", None) != "call":
                    continue
                props = {k: v for k, v in report.user_properties if k.startswith("distperf_")}
                if "distperf_tokens_per_sec" in props:
                    rows.append((report.nodeid, key, props))
        if not rows:
            return
        terminalreporter.write_sep("-", "distperf results")
        if self._gate is not None:
            topology = self._gate.topology
            notes = "".join(f"; {note}" for note in topology.notes)
            terminalreporter.write_line(
                f"topology {topology.key()} (from {topology.source}){notes}"
            )
        from pytest_distperf.output.report import RESULT_HEADER, format_result_line

        terminalreporter.write_line(RESULT_HEADER)
        for nodeid, outcome, props in rows:
            terminalreporter.write_line(format_result_line(nodeid, outcome, props))


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


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cpu_count() -> int:
    from pytest_distperf.launch.elastic import available_cpus

    return available_cpus()


def _known_models() -> tuple[str, ...]:
    from distperf_model.config import PRESETS

    return tuple(PRESETS)


def _marker_kwargs(item: pytest.Item) -> dict[str, Any]:
    marker = item.get_closest_marker(WORKLOAD_MARKER)
    if marker and marker.args:
        pytest.fail(f"{item.nodeid}: distperf marker takes keyword arguments only", pytrace=False)
    return dict(marker.kwargs) if marker else {}


def _workload_of(item: pytest.Item) -> Workload:
    kwargs = _marker_kwargs(item)
    try:
        workload = workload_from_marker(kwargs, item.nodeid, _known_models())
        _check_fits(workload, item.nodeid)
        return workload
    except SettingError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)  # outside `except`: no chained duplicate in the report


def _check_fits(workload: Workload, where: str) -> None:
    """The KV cache must hold the prompt and every new token (and the reference's steps)."""
    if ":" in workload.model:
        return
    from distperf_model.config import Config

    from pytest_distperf.spec import RunSpec

    steps = max(workload.max_new_tokens, RunSpec.reference_steps)
    block_size = Config.from_name(workload.model).block_size
    if workload.prompt_length + steps > block_size:
        raise SettingError(
            f"{where}: distperf(prompt_length={workload.prompt_length}, "
            f"max_new_tokens={workload.max_new_tokens}) needs {workload.prompt_length + steps} "
            f"positions but model {workload.model!r} has block_size={block_size}"
        )


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
            numa_binding=settings.numa_binding,
        )

    def run(self) -> RunResult:
        """Launch the ranks, then judge the result; a failed gate fails the test here."""
        from pytest_distperf.launch.elastic import RunFailed, SessionStopped, launch, run_in_job

        plugin = self._plugin
        spec = self.spec()
        if plugin.calibration is None and plugin.calibration_sizes is not None:
            spec = dataclasses.replace(spec, calibration_sizes=plugin.calibration_sizes)
        try:
            if plugin.job is not None:
                result = run_in_job(dataclasses.replace(spec, nodes=plugin.job.nodes))
            else:
                result = launch(spec)
        except RunFailed as error:
            failure = str(error)
        except SessionStopped as stop:
            # The shell's convention for a process ended by a signal: 128 + its number.
            pytest.exit(
                f"distperf: {stop.name} received while running {spec.test_id}; its ranks were "
                "stopped and the session ends here",
                returncode=128 + stop.signum,
            )
        else:
            failure = self._judge(result)
            if not failure:
                return result
        pytest.fail(failure, pytrace=False)

    def _judge(self, result: RunResult) -> str:
        """Record the result and apply the gates; the failure text, or "" when all passed."""
        from pytest_distperf.judge.checks import GateSettings
        from pytest_distperf.store.baseline import BaselineFileError

        plugin = self._plugin
        if result.calibration is not None:
            plugin.calibration = result.calibration
        self.results.append(result)
        settings = plugin.settings
        gate = plugin.gate()
        overrides = gate_from_marker(_marker_kwargs(self._item), self._item.nodeid)
        gate_settings = GateSettings(
            efficiency=settings.gate_value("efficiency", overrides),
            tolerance=settings.gate_value("tolerance", overrides),
            alpha=settings.alpha,
            strict=settings.strict,
            fail_on_improvement=settings.fail_on_improvement,
        )
        try:
            decision, prediction = gate.judge(result, gate_settings, plugin.calibration)
            recorded = gate.record(result, decision, prediction)
        except BaselineFileError as error:  # never overwritten; the user must look at it
            return f"distperf: {error}"
        except (OSError, TimeoutError) as error:  # unwritable directory, lock held too long
            return f"distperf: baseline store {gate.store!r}: {type(error).__name__}: {error}"
        row = result.summary()
        row.update(decision.fields())
        row["topology_key"] = gate.topology_key
        row["baseline_recorded"] = recorded
        row["prediction"] = prediction.to_dict() if prediction else None
        row["calibration"] = plugin.calibration.to_dict() if plugin.calibration else None
        first_timed = max(r.timed_from for r in result.ranks)
        row["session_to_first_timed_s"] = first_timed - plugin.started_at
        plugin.rows.append(row)
        for key in REPORTED_FIELDS:
            if row.get(key) is not None:
                self._item.user_properties.append((f"distperf_{key}", row[key]))
        self._item.user_properties.append(("distperf_ttft_ms", row["ttft_s"] * 1000))
        return decision.failure_text()


# Scalars that ride on the test report: the terminal table and JUnit XML properties.
REPORTED_FIELDS = (
    "tokens_per_sec",
    "decode_tokens_per_sec",
    "strategy",
    "devices",
    "accelerator",
    "topology_key",
    "predicted_tokens_per_sec",
    "threshold_tokens_per_sec",
    "bound",
    "baseline_tokens_per_sec",
    "change",
    "tolerance",
    "detectable_drop",
    "relative_speed",
    "relative_speed_change",
    "relative_speed_detectable_drop",
    "bare_change",
    "host_change",
    "change_beyond_host",
    "verdict",
    "peak_memory_bytes",
)


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
