"""The session's calibration, kept between sessions in pytest's cache (calibrations.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_distperf import calibrations
from pytest_distperf.options import Settings, resolve_settings
from pytest_distperf.perfmodel.calibration import Calibration, CollectiveFigure, MessageSizes
from pytest_distperf.spec import RunSpec, Workload

SIZES = MessageSizes((1024, 4096), (64,))


class Cache(dict):
    """pytest's cache as the plugin sees it: get(key, default), set(key, value)."""

    def set(self, key: str, value: Any) -> None:
        self[key] = value


@dataclass
class Gate:
    topology_key: str = "cpu_x2"


@dataclass
class Plugin:
    settings: Settings = field(default_factory=lambda: resolve_settings({"accelerator": "cpu"}, {}))
    calibration_sizes: dict[int, Any] = field(default_factory=lambda: {2: SIZES})
    calibrations: dict[int, Any] = field(default_factory=dict)
    builders_calibrated: set = field(default_factory=set)
    job: Any = None

    def gate(self) -> Gate:
        return Gate()


@dataclass
class Result:
    spec: RunSpec
    calibration: Any
    devices: int = 2


def _calibration(gather: tuple[int, ...] = (1024, 4096), in_step: float = 3e-4) -> Calibration:
    figures = tuple(CollectiveFigure.from_time("all_gather", b, 1e-3, 2) for b in gather)
    reduce = (CollectiveFigure.from_time("all_reduce", 64, 1e-4, 2),)
    return Calibration(2, "gloo", "cpu", figures, reduce, 1e10, 1e-4, in_step_latency_s=in_step)


def _spec(accelerator: str = "cpu", **workload: Any) -> RunSpec:
    return RunSpec("t::x[auto-2]", "auto", 2, accelerator, Workload(**workload), 5, 1, 600.0)


def test_a_session_calibrates_once_and_a_later_one_reuses_what_it_kept() -> None:
    cache, first = Cache(), Plugin()
    spec = calibrations.prepare(first, _spec(), cache)
    assert spec.calibration_sizes == SIZES  # nothing kept yet: the first run measures
    kept = calibrations.record(first, Result(spec, _calibration()), cache)
    assert kept == _calibration() and len(cache) == 1
    (entry,) = cache.values()
    assert entry["versions"] == calibrations.versions()
    later = Plugin()
    assert calibrations.prepare(later, _spec(), cache).calibration_sizes is None
    assert later.calibrations[2] == _calibration()


def test_a_size_not_kept_other_versions_or_recalibrate_measure_again() -> None:
    cache, plugin = Cache(), Plugin()
    calibrations.record(plugin, Result(_spec(), _calibration((1024,))), cache)
    assert calibrations.prepare(Plugin(), _spec(), cache).calibration_sizes == SIZES
    calibrations.record(Plugin(), Result(_spec(), _calibration()), cache)
    (key,) = cache
    cache[key] = {**cache[key], "versions": {"torch": "0.0"}}
    assert calibrations.prepare(Plugin(), _spec(), cache).calibration_sizes == SIZES
    calibrations.record(Plugin(), Result(_spec(), _calibration()), cache)
    again = Plugin(settings=resolve_settings({"accelerator": "cpu", "recalibrate": True}, {}))
    assert calibrations.prepare(again, _spec(), cache).calibration_sizes == SIZES
    cache[key] = {"versions": calibrations.versions(), "calibration": {"world_size": "x"}}
    assert calibrations.prepare(Plugin(), _spec(), cache).calibration_sizes == SIZES


def test_no_cache_or_a_job_over_nodes_keeps_nothing() -> None:
    assert calibrations.prepare(Plugin(), _spec(), None).calibration_sizes == SIZES
    cache, job = Cache(), Plugin(job=object())
    calibrations.record(job, Result(_spec(), _calibration()), cache)
    assert not cache and job.calibrations[2] == _calibration()


def test_a_builder_is_calibrated_at_its_own_sizes_once_on_several_gpus() -> None:
    plugin, cache = Plugin(), Cache()
    spec = calibrations.prepare(plugin, _spec("cuda", model="my_models:gpt"), cache)
    assert spec.calibrate_model
    calibrations.record(plugin, Result(spec, _calibration()), cache)
    again = _spec("cuda", model="my_models:gpt")
    assert not calibrations.prepare(plugin, again, cache).calibrate_model


def test_on_cpu_ranks_a_builder_or_a_step_is_calibrated_at_its_own_sizes_too() -> None:
    # The modelled rate is the threshold wherever ranks exchange collectives, loopback too.
    for workload in ({"model": "my_models:gpt"}, {"mode": "train"}):
        spec = calibrations.prepare(Plugin(), _spec(**workload), Cache())
        assert spec.calibrate_model and spec.calibration_sizes == SIZES


def test_a_kept_cpu_calibration_without_the_in_step_latency_is_measured_again() -> None:
    cache = Cache()
    calibrations.record(Plugin(), Result(_spec(), _calibration(in_step=0.0)), cache)
    assert calibrations.prepare(Plugin(), _spec(), cache).calibration_sizes == SIZES
    calibrations.record(Plugin(), Result(_spec(), _calibration()), cache)
    assert calibrations.prepare(Plugin(), _spec(), cache).calibration_sizes is None
