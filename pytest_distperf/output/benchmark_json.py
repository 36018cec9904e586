"""Results in pytest-benchmark's saved-JSON format, for `pytest-benchmark compare` and its readers.

What a "round" is
-----------------
pytest-benchmark's statistics are over *times* (seconds per round; ``ops`` = rounds per second),
so each timed repeat of a distperf test is one round and its value is the wall time of one whole
generation (prefill + decode, the slowest rank's, as `spec.py` defines it):
``batch_size * max_new_tokens / tokens_per_sec_sample``. ``iterations`` is 1, so ``ops`` reads as
generations per second. The figures distperf gates on (tokens/sec, decode tokens/sec, TTFT, peak
memory), the strategy, device count, topology key and implementation ride in ``extra_info``.

Each benchmark's ``fullname`` is the test's node id, so the same test lines up across files
(``--group-by=fullname``, 5.3's ``--between``); ``group`` names the workload, so one table holds
the strategies and device counts that ran the same generation, and ``params`` hold the run's
parameters (``--group-by=param:strategy`` works).

Statistics follow pytest-benchmark's definitions (``pytest_benchmark/stats.py``): sample standard
deviation, quartiles by Tukey's hinges as Wikipedia's "method 2" for even and "method 3" for odd
counts, Tukey fences at 1.5 IQR. ``hd15iqr`` is the highest datum at or below Q3 + 1.5 IQR, as its
docstring says and 5.3.x computes; 5.2.x returned the first datum *above* that fence when there was
one, a bug fixed upstream, so a 5.2 reader may show a different whisker for the same data.

No torch, no pytest (pytest-benchmark is read through its CLI).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_distperf.gitinfo import git
from pytest_distperf.jsonfields import is_number
from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.spec import Workload
from pytest_distperf.store.files import atomic_write_text

# The saved-JSON layout has been stable since pytest-benchmark 3.1 (which added "ops"); this is
# written as "version" when pytest-benchmark itself is not installed.
FORMAT_VERSION = "5.2.3"

# Workload fields that identify what was generated; the rest (seed, slowdown) stay in params.
_GROUP_FIELDS = ("model", "batch_size", "prompt_length", "max_new_tokens", "precision")

# Report fields that become benchmark identity or stats rather than extra_info.
_NOT_EXTRA = frozenset({"test_id"})


def to_benchmark_json(
    records: Sequence[JudgedRun],
    machine_info: Mapping[str, Any] | None = None,
    commit_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Convert judged runs to a pytest-benchmark JSON document.

    Runs without samples (a run that produced no timings) are left out, as pytest-benchmark
    leaves out benchmarks that errored. Samples that are not rates raise ValueError naming the
    test.
    """
    benchmarks: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for record in records:
        if not record.run.tokens_per_sec_samples:
            continue
        test_id = record.run.test_id or "unnamed"
        seen[test_id] = seen.get(test_id, 0) + 1
        benchmarks.append(_benchmark(record, test_id, seen[test_id]))
    if machine_info is None:
        machine_info = default_machine_info(records)
    if commit_info is None:
        commit_info = default_commit_info()
    return {
        "machine_info": dict(machine_info),
        "commit_info": dict(commit_info),
        "benchmarks": benchmarks,
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": _pytest_benchmark_version(),
    }


def write_benchmark_json(
    path: str | os.PathLike[str],
    records: Sequence[JudgedRun],
    machine_info: Mapping[str, Any] | None = None,
    commit_info: Mapping[str, Any] | None = None,
) -> Path:
    """Write `to_benchmark_json(records, ...)` to `path` atomically; return the path."""
    document = to_benchmark_json(records, machine_info=machine_info, commit_info=commit_info)
    # Strict JSON (no NaN/Infinity) because JavaScript readers of this format reject them.
    text = json.dumps(_finite(document), indent=4, ensure_ascii=True, allow_nan=False, default=str)
    return atomic_write_text(path, text + "\n")


def compute_stats(data: Sequence[float]) -> dict[str, Any]:
    """pytest-benchmark's per-benchmark "stats" for round times `data` (in run order)."""
    values = [float(value) for value in data]
    if not values:
        raise ValueError("no rounds to summarise")
    ordered = sorted(values)
    n = len(ordered)
    total = sum(values)
    mean = statistics.mean(values)
    stddev = statistics.stdev(values) if n > 1 else 0.0
    q1, q3 = _quartiles(ordered)
    iqr = q3 - q1
    low_fence, high_fence = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    stddev_outliers = sum(not (mean - stddev <= v <= mean + stddev) for v in values)
    iqr_outliers = sum(not (low_fence <= v <= high_fence) for v in values)
    return {
        "min": ordered[0],
        "max": ordered[-1],
        "mean": mean,
        "stddev": stddev,
        "rounds": n,
        "median": statistics.median(ordered),
        "iqr": iqr,
        "q1": q1,
        "q3": q3,
        "iqr_outliers": iqr_outliers,
        "stddev_outliers": stddev_outliers,
        "outliers": f"{stddev_outliers};{iqr_outliers}",
        # Whisker ends: the most extreme data still inside the Tukey fences.
        "ld15iqr": min(v for v in ordered if v >= low_fence),
        "hd15iqr": max(v for v in ordered if v <= high_fence),
        "ops": n / total if total else 0,
        "total": total,
        "data": values,
        "iterations": 1,
    }


def default_machine_info(records: Sequence[JudgedRun] = ()) -> dict[str, Any]:
    """The host as pytest-benchmark describes it, without its slow CPU probe, plus accelerators."""
    info: dict[str, Any] = {
        "node": platform.node(),
        "processor": platform.processor(),
        "machine": platform.machine(),
        "python_compiler": platform.python_compiler(),
        "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(),
        "python_version": platform.python_version(),
        "python_build": list(platform.python_build()),
        "release": platform.release(),
        "system": platform.system(),
        "cpu": {
            "brand_raw": _cpu_brand(),
            "arch_string_raw": platform.machine(),
            "count": os.cpu_count(),
        },
    }
    devices = sorted({r.run.device_name for r in records if r.run.device_name})
    keys = sorted({r.topology_key for r in records if r.topology_key})
    if devices or keys:
        info["distperf"] = {"device_names": devices, "topology_keys": keys}
    return info


def default_commit_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """pytest-benchmark's commit_info from git, each call bounded; 'unversioned' outside git."""
    where = Path(cwd) if cwd is not None else Path.cwd()
    info: dict[str, Any] = {
        "id": "unversioned",
        "time": None,
        "author_time": None,
        "dirty": False,
        "project": where.resolve().name,
        "branch": "(unknown)",
    }
    try:
        inside = git(where, "rev-parse", "--is-inside-work-tree")
    except OSError:
        return info  # no git at all: what pytest-benchmark calls unversioned
    except subprocess.CalledProcessError as error:
        if "not a git repository" not in (error.stderr or ""):
            # e.g. "dubious ownership" on a CI runner: say why the commit is missing.
            info["error"] = (error.stderr or repr(error)).strip()
        return info
    except subprocess.SubprocessError as error:
        info["error"] = repr(error)
        return info
    if inside != "true":  # inside .git itself
        return info
    try:
        head = git(where, "log", "-1", "--format=%H%n%cI%n%aI")
        commit, commit_time, author_time = head.split("\n")
        info.update(id=commit, time=commit_time, author_time=author_time)
        info["project"] = Path(git(where, "rev-parse", "--show-toplevel")).name
        # Tracked files only: build outputs and reports a run leaves behind are not a change.
        info["dirty"] = bool(git(where, "status", "--porcelain", "--untracked-files=no"))
        branch = git(where, "rev-parse", "--abbrev-ref", "HEAD")
        if branch == "HEAD":  # CI checkouts are detached; the CI system knows the branch
            branch = (
                os.environ.get("GITHUB_HEAD_REF")
                or os.environ.get("GITHUB_REF_NAME")
                or os.environ.get("CI_COMMIT_REF_NAME")
                or "(detached head)"
            )
        info["branch"] = branch
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        # A repository without commits, a hung git: record why instead of failing the report.
        info["error"] = repr(error)
    return info


def _benchmark(record: JudgedRun, test_id: str, occurrence: int) -> dict[str, Any]:
    run = record.run
    new_tokens = run.workload.max_new_tokens * run.workload.batch_size
    rates = run.tokens_per_sec_samples
    if not all(is_number(r) and math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"{test_id}: tokens_per_sec_samples must be positive numbers: {rates!r}")
    # Two runs in one test keep distinct names, so compare tables never merge them.
    suffix = "" if occurrence == 1 else f" #{occurrence}"
    fullname = test_id + suffix
    name = test_id.rsplit("::", 1)[-1] + suffix
    extra = {key: value for key, value in record.to_json().items() if key not in _NOT_EXTRA}
    extra.update(
        topology_key=record.topology_key,
        new_tokens_per_generation=new_tokens,
        round="one timed generation (prefill + decode), slowest rank, seconds",
    )
    return {
        "group": _group(run.workload),
        "name": name,
        "fullname": fullname,
        "params": {
            "strategy": run.strategy,
            "devices": run.devices,
            "accelerator": run.accelerator,
            **run.workload.params(),
        },
        "param": _param_id(test_id),
        "extra_info": _finite(extra),
        "options": {
            "disable_gc": False,
            "timer": "distperf: synchronised wall time of the slowest rank",
            "min_rounds": run.repeats,
            "max_time": None,
            "min_time": None,
            "warmup": bool(run.warmup),
            "warmup_iterations": run.warmup,
        },
        "stats": compute_stats([new_tokens / rate for rate in rates]),
    }


def _quartiles(ordered: Sequence[float]) -> tuple[float, float]:
    n = len(ordered)
    if n == 1:
        return ordered[0], ordered[0]
    if n % 2 == 0:  # medians of the lower and upper halves
        return statistics.median(ordered[: n // 2]), statistics.median(ordered[n // 2 :])
    # Odd n: Wikipedia's method 3 is linear interpolation at positions (n-2)/4 and (3n-2)/4
    # (0-based): weights 1/4 and 3/4 between neighbours, exact in binary floating point.
    return _at(ordered, (n - 2) / 4), _at(ordered, (3 * n - 2) / 4)


def _at(ordered: Sequence[float], position: float) -> float:
    index = math.floor(position)
    weight = position - index
    return (1 - weight) * ordered[index] + weight * ordered[index + 1]


def _group(workload: Workload) -> str:
    return " ".join(f"{key}={getattr(workload, key)}" for key in _GROUP_FIELDS)


def _param_id(test_id: str) -> str | None:
    name = test_id.rsplit("::", 1)[-1]
    if name.endswith("]") and "[" in name:
        return name[name.index("[") + 1 : -1]
    return None


def _finite(value: Any) -> Any:
    """Non-finite floats as strings ("inf"), since strict JSON has no Infinity or NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _cpu_brand() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _pytest_benchmark_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-benchmark")
    except PackageNotFoundError:
        return FORMAT_VERSION
