"""The `distperf` fixture's object: `run()` builds the test's RunSpec, launches its ranks through
the session's plugin, judges the result and fails the test on a failed gate."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

from pytest_distperf import calibrations, markers, xdist
from pytest_distperf.measured import RunResult
from pytest_distperf.options import gate_from_marker
from pytest_distperf.spec import RunSpec


class DistperfRun:
    """The `distperf` fixture: `run()` launches the test's ranks and returns a RunResult."""

    # plugin: the session's plugin.DistperfPlugin
    def __init__(self, item: pytest.Item, plugin: Any, strategy: str, devices: int) -> None:
        self._item = item
        self._plugin = plugin
        self.strategy = strategy
        self.devices = devices
        self.workload = markers.workload_of(item)
        if plugin.slowdown is not None:
            self.workload = dataclasses.replace(self.workload, slowdown=plugin.slowdown)
        self.results: list[RunResult] = []

    @property
    def accelerator(self) -> str:
        """Where this session's ranks run: "cpu" or "cuda"."""
        return self._plugin.resolve().accelerator

    def spec(self) -> RunSpec:
        resolved = self._plugin.resolve()
        settings = self._plugin.settings
        return RunSpec(
            test_id=xdist.plain_nodeid(self._item.nodeid),
            strategy=self.strategy,
            devices=self.devices,
            accelerator=resolved.accelerator,
            workload=self.workload,
            repeats=settings.repeats,
            warmup=settings.warmup,
            timeout=settings.timeout,
            numa_binding=settings.numa_binding,
            sys_path=tuple(sys.path),  # what the test can import, its ranks can
            test_dir=markers.test_dir(self._item),
            compile=settings.compile if self.workload.compile is None else self.workload.compile,
            count_work=settings.count,
            relative_speed=settings.gate_value("relative_speed", self._marker_gates()),
        )

    def _marker_gates(self) -> dict[str, object]:
        return gate_from_marker(markers.marker_kwargs(self._item), self._item.nodeid)

    def run(self) -> RunResult:
        """Launch the ranks, then judge the result; a failed gate fails the test here."""
        from pytest_distperf.launch.failures import RunFailed
        from pytest_distperf.launch.signals import SessionStopped

        plugin = self._plugin
        spec = self.spec()
        spec = calibrations.prepare(plugin, spec, getattr(self._item.config, "cache", None))
        try:
            result = self._launch(spec)
        except RunFailed as error:
            self._attach_rank_output()
            failure = str(error)
            if error.stops:  # pytest reports what ran, then this line, and ends the session
                self._item.session.shouldfail = error.stops
        except SessionStopped as stop:
            # The shell's convention for a process ended by a signal: 128 + its number.
            pytest.exit(
                f"distperf: {stop.name} received while running {spec.test_id}; its ranks were "
                "stopped and the session ends here",
                returncode=128 + stop.signum,
            )
        else:
            self._attach_rank_output()
            failure = self._judge(result)
            if not failure:
                return result
        pytest.fail(failure, pytrace=False)

    def _launch(self, spec: RunSpec) -> RunResult:
        from pytest_distperf.progress import ProgressLine

        line = ProgressLine(self._item.config)
        try:
            return self._plugin.launch(spec, progress=line if line.active else None)
        finally:
            line.clear()  # before pytest writes the outcome on that line

    def _attach_rank_output(self) -> None:
        # Shown with a failing test, like pytest's own captured output.
        for rank, text in self._plugin.rank_output().items():
            if text.strip():
                self._item.add_report_section("call", f"rank {rank} output", text)

    def _judge(self, result: RunResult) -> str:
        """Record the result and apply the gates; the failure text, or "" when all passed."""
        from pytest_distperf.judge.checks import GateSettings
        from pytest_distperf.store.store import BaselineFileError

        plugin = self._plugin
        calibration = calibrations.record(plugin, result, getattr(self._item.config, "cache", None))
        self.results.append(result)
        settings = plugin.settings
        gate = plugin.gate()
        overrides = self._marker_gates()  # the marker's twins win over the session's settings
        per_test = ("efficiency", "tolerance", "gates", "work_tolerance")
        gate_settings = GateSettings(
            **{name: settings.gate_value(name, overrides) for name in per_test},
            alpha=settings.alpha,
            strict=settings.strict,
            fail_on_improvement=settings.fail_on_improvement,
        )
        try:
            record = gate.judge(
                result, gate_settings, calibration, session_started_at=plugin.started_at
            )
        except BaselineFileError as error:  # never overwritten; the user must look at it
            return f"distperf: {error}"
        except (OSError, TimeoutError) as error:  # unwritable directory, lock held too long
            return f"distperf: baseline store {gate.store!r}: {type(error).__name__}: {error}"
        plugin.records.append(record)
        self._item.stash.setdefault(xdist.RECORDS, []).append(record)
        # The JUnit XML properties; the terminal table is made from the records.
        from pytest_distperf.output.report import junit_properties

        self._item.user_properties.extend(junit_properties(record))
        if plugin.writes_files:  # one copy of each run, as for the reports
            from pytest_distperf.output.benchmark_session import add_benchmark

            add_benchmark(self._item, record, occurrence=len(self.results))
        return record.decision.failure_text()
