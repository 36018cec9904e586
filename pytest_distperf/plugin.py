"""pytest hooks of pytest-distperf, imported on every pytest start: no torch, the rest lazily."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf import markers, xdist
from pytest_distperf.fixture import DistperfRun
from pytest_distperf.launch.early import process_started_at, start_first_pool
from pytest_distperf.measured import RunResult
from pytest_distperf.options import (
    OPTIONS,
    SettingError,
    Settings,
    env_slowdown,
    resolve_settings,
)
from pytest_distperf.platform import Platform, platform_of
from pytest_distperf.spec import RunSpec


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distperf", "distributed performance regression tests")
    for spec in OPTIONS:
        if spec.is_flag:
            group.addoption(spec.flag, dest=spec.ini, action="store_true", help=spec.help)
        else:
            group.addoption(spec.flag, dest=spec.ini, default=None, help=spec.help)
        shown = "true/false" if spec.is_flag else f"default {spec.default or 'unset'}"
        # a string, not type="bool": pytest's own bool parsing fails without naming the option
        parser.addini(spec.ini, f"{spec.help} ({shown})", default="")


def pytest_configure(config: pytest.Config) -> None:
    markers.register(config)
    cli = {spec.name: config.getoption(spec.ini) for spec in OPTIONS}
    ini = {spec.name: config.getini(spec.ini) or None for spec in OPTIONS}
    try:
        settings = resolve_settings(cli, ini, str(config.inipath) if config.inipath else None)
        slowdown = env_slowdown()
    except SettingError as error:
        raise pytest.UsageError(f"pytest-distperf: {error}") from None
    if settings.json:  # fail now, not after an hour of tests
        try:
            Path(settings.json).resolve().parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise pytest.UsageError(
                f"pytest-distperf: --distperf-json {settings.json}: cannot create its "
                f"directory: {error}"
            ) from None
    from pytest_distperf.launch.job import launched_job, notice_writer

    try:
        job = launched_job()
    except ValueError as error:
        raise pytest.UsageError(f"pytest-distperf: {error}") from None
    if job is not None and job.launcher == "srun":
        os.environ.update(job.environment())  # what env:// and Fabric read in every rank
    notice = notice_writer(config) if job is not None and job.rank == 0 else None
    plugin = DistperfPlugin(settings, slowdown, config.rootpath, job, notice, config)
    config.pluginmanager.register(plugin, "distperf-session")
    if xdist.is_controller(config) or xdist.is_worker(config):
        config.pluginmanager.register(xdist.Relay(plugin), "distperf-xdist")


@dataclass(frozen=True)
class Resolved:
    platform: Platform
    devices: int
    visible_gpus: int

    @property
    def accelerator(self) -> str:
        return self.platform.name

    def lacks_gpus(self, devices: int) -> bool:
        """More ranks than visible GPUs, where each needs its own (such a test skips)."""
        return self.platform.gpus and devices > self.visible_gpus


@dataclass(eq=False)  # hashable: pytest keeps plugins in sets
class DistperfPlugin:
    """Session state, registered in pytest_configure (as pytest-xdist does)."""

    settings: Settings
    slowdown: float | None
    rootpath: Path = field(default_factory=Path.cwd)
    job: Any = None  # launch.job.LaunchedJob when pytest runs inside a torchrun/SLURM job
    job_notice: Any = None  # rank 0 of a job: says why the job stops if its test never returns
    config: Any = field(default=None, repr=False)  # pytest.Config
    records: list[Any] = field(default_factory=list)  # judge.record.JudgedRun, one per run
    started_at: float = field(default_factory=process_started_at)  # pytest's start
    # Calibrated by the first run of each rank count at the union of its tests' message sizes.
    calibration_sizes: dict[int, Any] = field(default_factory=dict)  # count -> MessageSizes
    calibrations: dict[int, Any] = field(default_factory=dict)  # rank count -> Calibration
    builders_calibrated: set[tuple[Any, ...]] = field(default_factory=set)  # calibrations.py
    _gate: Any = field(default=None, repr=False)
    pools: Any = None  # launch.pool.Pools, made once collection has selected distperf tests
    topology: Any = None  # the Topology an xdist worker's runs were held to (controller only)
    # Node ids of the session's tests, run or not: their baseline entries are no orphans.
    collected: set[str] = field(default_factory=set, repr=False)
    _orphans: tuple[Any, ...] | None = field(default=None, repr=False)  # (Orphans,) once found

    _resolved: Resolved | None = field(default=None, repr=False)

    @property
    def writes_files(self) -> bool:
        """Only rank 0 of a launched job writes reports and baselines."""
        return self.job is None or self.job.rank == 0

    def resolve(self) -> Resolved:
        """Accelerator and device count for this session, counted without importing torch."""
        if self._resolved is None:
            from pytest_distperf.topology.gpus import visible_gpus
            from pytest_distperf.topology.host import available_cpus

            visible = visible_gpus() if self.settings.accelerator != "cpu" else 0
            accelerator = self.settings.accelerator
            if accelerator == "auto":
                accelerator = "cuda" if visible else "cpu"
            platform = platform_of(accelerator)
            devices = self.settings.devices
            if self.job is not None:
                devices = self.job.world_size  # the job's ranks are the test's ranks
            elif devices is None:  # "auto": all visible GPUs; on CPU, one rank per core
                devices = visible if platform.gpus and visible else available_cpus()
            if self.job is not None and platform.gpus:
                visible = devices  # one GPU per rank, each rank sees its own
            self._resolved = Resolved(platform, devices, visible)
        return self._resolved

    def gate(self) -> Any:
        """The session's judge (topology probed or loaded once, baseline store), on first use."""
        if self._gate is None:
            from pytest_distperf.gitinfo import current_commit
            from pytest_distperf.judge.gate import Gate, default_baseline_dir
            from pytest_distperf.store.store import BaselineStore
            from pytest_distperf.topology import TopologyError, load_topology, probe

            resolved = self.resolve()
            per_node = resolved.devices if self.job is None else self.job.local_world_size
            if self.settings.topology:
                try:
                    topology = load_topology(self.settings.topology, per_node)
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
                # Enough devices for the largest rank count of any selected test (a job: a node's).
                largest = max([per_node, *self.calibration_sizes]) if self.job is None else per_node
                if resolved.platform.gpus:
                    largest = min(largest, max(resolved.visible_gpus, 1))
                topology = probe(resolved.accelerator, largest)
            topology = topology if self.job is None else self.job.topology(topology)
            directory = self.settings.baseline_dir or default_baseline_dir(self.rootpath)
            self._gate = Gate(
                rootpath=self.rootpath,
                topology=topology,
                store=BaselineStore(directory),
                update=self.settings.update_baselines,
                writes=self.writes_files,
                commit=current_commit(self.rootpath) if self.settings.update_baselines else None,
            )
        return self._gate

    def launch(self, spec: RunSpec, progress: Callable[[str], None] | None = None) -> RunResult:
        """Run `spec` in the job's ranks, in fresh ranks, or in the session's pool (whose rank 0
        reports its progress to `progress`)."""
        if self.job is not None:
            from pytest_distperf.launch.job import run_in_job

            return run_in_job(dataclasses.replace(spec, nodes=self.job.nodes), self.job_notice)
        if self.settings.fresh_ranks or spec.numa_binding is not None:
            # torch's NUMA binding is applied by the elastic launcher as it starts a rank.
            from pytest_distperf.launch.elastic import launch

            return launch(spec)
        if self.pools is None:
            from pytest_distperf.launch.pool import Pools

            self.pools = Pools()
        # pytest -s: the ranks' output streams to the terminal
        live = self.config is not None and self.config.getoption("capture", None) == "no"
        return self.pools.run(spec, live=sys.stdout if live else None, progress=progress)

    def rank_output(self) -> dict[int, str]:
        """Each rank's output during the last pooled run (for the report's sections)."""
        return self.pools.last_output if self.pools is not None else {}

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.pools is not None:
            self.pools.close()
        if self.job is not None:  # every rank ends together, rank 0's report written
            from pytest_distperf.launch.job import leave_job

            leave_job()

    @pytest.hookimpl
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "distperf" in metafunc.fixturenames:
            resolved = self.resolve()
            markers.parametrize(metafunc, resolved.accelerator, resolved.devices)

    @pytest.hookimpl
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        markers.prepare(config, items, self.resolve().devices)

    @pytest.hookimpl
    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.collected.update(xdist.plain_nodeid(item.nodeid) for item in items)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.collected.add(xdist.plain_nodeid(report.nodeid))

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter prints the collection report
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected.update(xdist.plain_nodeid(item.nodeid) for item in session.items)
        # After -k, -m and --lf have deselected: only the tests that will run are measured.
        if session.config.getoption("collectonly"):
            return
        workloads = markers.workloads_by_count(session.items, self.resolve().devices)
        if not workloads:
            return
        first = min(workloads)  # the items run by rank count (markers.prepare)
        if not self.settings.topology:  # a bad topology file is a usage error before any rank
            start_first_pool(self, session.config, first)
        from pytest_distperf.judge.gate import session_message_sizes

        cap = self.resolve().platform.calibration_max_bytes
        self.calibration_sizes = {
            count: session_message_sizes(pairs, count, cap) for count, pairs in workloads.items()
        }
        if not xdist.is_worker(session.config):  # a worker may run none of them: on first use
            self.gate()  # a bad --distperf-topology is a usage error before any rank starts
        if self.settings.topology:
            start_first_pool(self, session.config, first)

    @pytest.hookimpl
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        from pytest_distperf.header import report_header

        return report_header(self, config)

    @pytest.hookimpl
    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        if self._gate is None or config.get_verbosity() < 0:
            return []
        from pytest_distperf.header import collection_lines

        return collection_lines(self._gate.topology, self.calibration_sizes)

    def topology_of_gate(self) -> Any:
        """The session's topology: its gate's, or on an xdist controller the workers'."""
        return self._gate.topology if self._gate is not None else self.topology

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # An xdist worker's runs ride on its test reports; the controller writes the files.
        if not self.writes_files or xdist.is_worker(session.config):
            return
        orphans = self.baseline_orphans()
        if self.settings.json:
            from pytest_distperf.output.report import write_json_report

            extra = {} if orphans is None else {"baseline_orphans": orphans.to_json()}
            write_json_report(self.settings.json, self.records, extra)

    def baseline_orphans(self) -> Any:
        """This machine's entries that no test of the session matched while some test found
        none (store.orphans.Orphans), or None; an xdist controller's gate is on its workers."""
        gate = self._gate
        missing = gate is not None and not all(found for _, found in gate.looked_up.values())
        if self._orphans is None and missing:
            from pytest_distperf.store.identity import repository_nodeid
            from pytest_distperf.store.orphans import find_orphans
            from pytest_distperf.store.store import BaselineFileError

            try:
                entries = gate.store.load(gate.topology_key)
            except BaselineFileError:  # the tests failed naming it already
                entries = {}
            forms = [(n, repository_nodeid(n, self.rootpath)) for n in self.collected]
            found = find_orphans(
                entries,
                gate.looked_up,
                {form for pair in forms for form in pair},
                topology_key=gate.topology_key,
                baseline_file=str(gate.store.path(gate.topology_key)),
                directory=str(gate.store.directory),
            )
            self._orphans = () if found is None else (found,)  # looked for once
        return self._orphans[0] if self._orphans else None

    # pytest-benchmark's hooks (output/benchmark_session.py); optional: it may not be loaded.
    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(self, machine_info: dict[str, Any]) -> None:
        from pytest_distperf.output.benchmark_session import update_machine_info

        update_machine_info(machine_info, self.records)

    @pytest.hookimpl(optionalhook=True, wrapper=True)
    def pytest_benchmark_compare_machine_info(self, compared_benchmark: dict[str, Any]) -> Any:
        from pytest_distperf.output.benchmark_session import without_distperf_machine_info

        saved = compared_benchmark.get("machine_info")
        reduced = without_distperf_machine_info(compared_benchmark)
        if reduced is not None:  # loaded at configure time, before any run described this machine
            compared_benchmark["machine_info"] = reduced
        try:
            return (yield)
        finally:
            compared_benchmark["machine_info"] = saved

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        outcomes = {
            xdist.plain_nodeid(report.nodeid): key
            for key in ("passed", "failed")
            for report in terminalreporter.stats.get(key, [])
            if getattr(report, "when", None) == "call"
        }
        shown = [record for record in self.records if record.run.test_id in outcomes]
        if shown:
            terminalreporter.write_sep("-", "distperf results")
            if self.topology_of_gate() is not None:
                from pytest_distperf.header import topology_line

                terminalreporter.write_line(topology_line(self.topology_of_gate()))
            from pytest_distperf.output.report import result_lines

            verbose = terminalreporter.config.option.verbose > 0
            for line in result_lines(shown, outcomes, verbose):
                terminalreporter.write_line(line)
        orphans = self.baseline_orphans() if self.writes_files else None
        if orphans is not None:
            terminalreporter.write_sep("-", "distperf baseline orphans", yellow=True)
            for line in orphans.lines():
                terminalreporter.write_line(line)


@pytest.fixture
def distperf_strategy(request: pytest.FixtureRequest) -> str:
    """The strategy of this test item (parametrised from @pytest.mark.strategy)."""
    return getattr(request, "param", "auto")


@pytest.fixture
def distperf_devices(request: pytest.FixtureRequest) -> int | None:
    """This item's rank count from @pytest.mark.devices; None: --distperf-devices."""
    return getattr(request, "param", None)


@pytest.fixture
def distperf(
    request: pytest.FixtureRequest, distperf_strategy: str, distperf_devices: int | None
) -> DistperfRun:
    """Runs the test's model in N ranks under its strategy: `result = distperf.run()`."""
    markers.check_item(request.node, distperf_strategy)
    plugin: DistperfPlugin = request.config.pluginmanager.get_plugin("distperf-session")
    resolved = plugin.resolve()
    devices = distperf_devices or resolved.devices
    source = "@pytest.mark.devices" if distperf_devices else "--distperf-devices"
    if plugin.job is not None and devices != plugin.job.world_size:
        pytest.skip(
            f"distperf: {devices} ranks requested ({source}) but this job has "
            f"{plugin.job.world_size}"
        )
    if resolved.lacks_gpus(devices):
        pytest.skip(
            f"distperf: {devices} CUDA devices requested ({source}) "
            f"but {resolved.visible_gpus} visible"
        )
    markers.check_supported(
        request.node, distperf_strategy, resolved.accelerator, devices, bool(distperf_devices)
    )
    return DistperfRun(request.node, plugin, distperf_strategy, devices)
