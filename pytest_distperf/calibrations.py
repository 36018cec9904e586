"""Which collectives a run calibrates (a builder's model and a training step at their own sizes),
and the calibration kept in pytest's cache by topology, rank count and versions (not in a job)."""

from __future__ import annotations

import dataclasses
import platform
from importlib import metadata
from typing import Any

from pytest_distperf.spec import RunSpec

CACHE_KEY = "distperf/calibration"
VERSIONED = ("torch", "lightning")  # what its figures depend on besides the machine


def prepare(plugin: Any, spec: RunSpec, cache: Any) -> RunSpec:
    """`spec` with what its run must calibrate; the session's calibration taken from `cache`
    (pytest's, None where disabled) where it holds every size the session needs."""
    sizes = plugin.calibration_sizes.get(spec.devices)
    if spec.devices not in plugin.calibrations and sizes is not None:
        kept = None if plugin.settings.recalibrate else _load(plugin, spec.devices, cache)
        if kept is not None and covers(kept, sizes):
            plugin.calibrations[spec.devices] = kept
        else:
            spec = dataclasses.replace(spec, calibration_sizes=sizes)
    own_sizes = spec.workload.is_custom_builder or spec.workload.training
    if own_sizes and builder_key(spec) not in plugin.builders_calibrated:
        spec = dataclasses.replace(spec, calibrate_model=True)
    return spec


def record(plugin: Any, result: Any, cache: Any) -> Any:
    """The rank count's calibration merged with what `result` measured (kept in `cache` too);
    None where none was measured or kept."""
    if result.calibration is not None:
        known = plugin.calibrations.get(result.devices)
        merged = result.calibration if known is None else known.merged(result.calibration)
        plugin.calibrations[result.devices] = merged
        if result.spec.calibrate_model:
            plugin.builders_calibrated.add(builder_key(result.spec))
        if cache is not None and plugin.job is None:
            entry = {"versions": versions(), "calibration": merged.to_dict()}
            cache.set(_key(plugin, result.devices), entry)
    return plugin.calibrations.get(result.devices)


def covers(calibration: Any, sizes: Any) -> bool:
    """Whether `calibration` measured every size of `sizes` (perfmodel.MessageSizes), and the
    in-step latency where the host runs the compute."""
    from pytest_distperf.platform import PLATFORMS

    platform = PLATFORMS.get(calibration.device_type)
    host_computes = platform is not None and not platform.queues_kernels
    if host_computes and calibration.world_size > 1 and not calibration.in_step_latency_s:
        return False
    wanted = {"all_gather": sizes.all_gather, "all_reduce": sizes.all_reduce, "p2p": sizes.p2p}
    return all(
        set(needed) <= {f.bytes for f in calibration.figures(op)} for op, needed in wanted.items()
    )


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def builder_key(spec: RunSpec) -> tuple[Any, ...]:
    """What a calibration at a model's own sizes depends on (training: a step's sizes)."""
    w = spec.workload
    train = (w.seq_length, spec.strategy) if w.training else ()
    return (spec.devices, w.model, w.precision, w.batch_size, *train)


def _load(plugin: Any, devices: int, cache: Any) -> Any:
    """The kept calibration for this machine, rank count and versions; None where there is
    none or it is unreadable (then it is measured again and overwritten)."""
    if cache is None or plugin.job is not None:
        return None
    from pytest_distperf.perfmodel.calibration import Calibration

    entry = cache.get(_key(plugin, devices), None)
    if not isinstance(entry, dict) or entry.get("versions") != versions():
        return None
    try:
        return Calibration.from_dict(entry.get("calibration"))
    except (ValueError, TypeError, KeyError):
        return None


def _key(plugin: Any, devices: int) -> str:
    return f"{CACHE_KEY}/{plugin.gate().topology_key}/{devices}"
