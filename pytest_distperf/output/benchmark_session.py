"""Every distperf run as a benchmark of pytest-benchmark's session (saving, comparing, exports):
one round per timed generation (the slowest rank's prefill + decode), EXTRA_INFO's figures."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.output.report import COUNTED, SCALARS

# The name pytest-benchmark registers its BenchmarkSession under in pytest_configure.
SESSION_PLUGIN = "pytest-benchmark"
MACHINE_INFO_KEY = "distperf"
# The run's figures in `extra_info`, in this order (keys of its JSON row, JudgedRun.to_dict).
EXTRA_INFO = (
    *SCALARS,
    *("tokens_per_sec_samples", "aggregate_tokens_per_sec", "ttft_s", *COUNTED),
    *("model_flops_per_step", "peak_flops", "peak_flops_source", "workload", "implementation"),
    *("device_name", "bound_description", "link_class"),
)


@dataclass
class MeasuredRun:
    """What `Metadata` reads from a `BenchmarkFixture`, for rounds timed in the rank processes."""

    name: str
    fullname: str
    group: str
    param: str | None
    params: dict[str, Any]
    extra_info: dict[str, Any] = field(default_factory=dict)
    cprofile_stats: Any = None
    has_error: bool = False


def add_benchmark(item: pytest.Item, record: JudgedRun, occurrence: int) -> bool:
    """Add the run to pytest-benchmark's session; False when it is not recording. A second run
    in one test gets its own name, so saved runs never merge the two."""
    session, result = item.config.pluginmanager.get_plugin(SESSION_PLUGIN), record.run
    # Disabled under xdist and with --benchmark-disable: its fixture records nothing then either.
    disabled = session is None or getattr(session, "disabled", True)
    if disabled or not hasattr(session, "benchmarks") or not result.samples:
        return False
    from pytest_benchmark.stats import Metadata  # lazy: only when pytest-benchmark is active

    suffix = "" if occurrence == 1 else f" #{occurrence}"
    callspec = getattr(item, "callspec", None)
    measured = MeasuredRun(
        name=item.name + suffix,
        fullname=item.nodeid + suffix,
        group=function_id(item),
        param=callspec.id if callspec is not None else None,
        params={
            "strategy": result.strategy,
            "devices": result.devices,
            "accelerator": result.spec.accelerator,
            **result.spec.workload.params(),
        },
        extra_info=extra_info(record),
    )
    options = {
        "disable_gc": False,
        "timer": "distperf: slowest rank, synchronised, prefill + decode",
        "min_rounds": result.spec.repeats,
        "max_time": None,
        "min_time": None,
        "precision": None,
        "confidence": None,
        "warmup": result.spec.warmup,
    }
    stats = Metadata(measured, iterations=1, options=options)
    for sample in result.samples:
        stats.update(sample.total_s)
    session.benchmarks.append(stats)
    return True


def function_id(item: pytest.Item) -> str:
    """The node id without the parametrisation: `path::Class::test_function`."""
    original = getattr(item, "originalname", item.name)
    return item.nodeid[: len(item.nodeid) - len(item.name)] + original


def extra_info(record: JudgedRun) -> dict[str, Any]:
    """EXTRA_INFO's figures and the tokens of a generation as plain JSON, None left out."""
    row = record.to_dict()
    row["new_tokens_per_generation"] = record.run.new_tokens
    names = (*EXTRA_INFO, "new_tokens_per_generation")
    return _finite({name: row[name] for name in names if row.get(name) is not None})


def update_machine_info(machine_info: dict[str, Any], records: Iterable[JudgedRun]) -> None:
    """The session's topology keys and devices in pytest-benchmark's machine info, if any."""
    records = list(records)
    keys = sorted({r.topology_key for r in records if r.topology_key})
    devices = sorted({r.run.device_name for r in records if r.run.device_name})
    if keys or devices:
        machine_info[MACHINE_INFO_KEY] = {"topology_keys": keys, "device_names": devices}


def without_distperf_machine_info(compared: dict[str, Any]) -> dict[str, Any] | None:
    """The saved machine info less this plugin's part (None when it has none): it is compared
    before a run describes the machine; the topology key is in `extra_info`."""
    saved = compared.get("machine_info")
    if not isinstance(saved, Mapping) or MACHINE_INFO_KEY not in saved:
        return None
    return {key: value for key, value in saved.items() if key != MACHINE_INFO_KEY}


def _finite(value: Any) -> Any:
    """Non-finite floats as strings ("inf"): strict JSON readers reject Infinity and NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
