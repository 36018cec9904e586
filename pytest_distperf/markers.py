"""What a distperf test asks for, read from its markers at collection (no torch): its items, their
order, xdist refusal. A bad marker fails only its own test, at setup (an `Invalid` parameter)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import pytest

from pytest_distperf import xdist
from pytest_distperf.options import GATE_ARGUMENTS, SettingError, workload_from_marker
from pytest_distperf.spec import Workload
from pytest_distperf.strategies import get_strategy, strategy_names

STRATEGY_MARKER = "strategy"
DEVICES_MARKER = "devices"
WORKLOAD_MARKER = "distperf"
INVALID_ID = "invalid-marker"
REFUSED = pytest.StashKey[str]()  # why this item must not start ranks here (xdist)


@dataclass(frozen=True)
class Invalid:
    """The `distperf_strategy` parameter of a test whose markers are bad."""

    message: str


# The distperf marker's arguments with their defaults: the workload's, then the gates' twins.
_ARGUMENTS = ", ".join(
    [*(f"{f.name}={f.default!r}" for f in fields(Workload)), *(f"{n}=None" for n in GATE_ARGUMENTS)]
)


def register(config: pytest.Config) -> None:
    """Marker help for `pytest --markers`, and for --strict-markers."""
    for text in (
        f"{STRATEGY_MARKER}(*names): run this distperf test once per parallel strategy; "
        f"names: {', '.join(strategy_names())}",
        f"{DEVICES_MARKER}(*counts): run this distperf test once per rank count, e.g. "
        "devices(1, 2, 4); without it, --distperf-devices",
        f"{WORKLOAD_MARKER}({_ARGUMENTS}): the workload a distperf test generates "
        "(mode='train': optimizer steps on batch_size sequences of seq_length tokens), and its "
        "per-test gate settings (gates=False: measured and reported, never failed by a check; "
        "relative_speed=True: the bare model timed beside a replicated strategy's repeats too)",
    ):
        config.addinivalue_line("markers", text)


def parametrize(metafunc: pytest.Metafunc, accelerator: str, default_devices: int) -> None:
    """One item per (strategy, rank count), ids like `fsdp-2cpu`; one failing item when the
    markers are bad."""
    where = metafunc.definition.nodeid
    try:
        names = _strategy_names(metafunc.definition, where)
        counts = _device_counts(metafunc.definition, where)
        workload = workload_of(metafunc.definition)
    except SettingError as error:
        invalid = [(Invalid(str(error)), None)]
        metafunc.parametrize(xdist.ARGNAMES, invalid, ids=[INVALID_ID], scope="function")
        return
    params, ids = [], []
    for name in names:
        for count in counts:
            unfit = strategy_unfit(name, workload, count or default_devices)
            params.append((Invalid(f"{where}: {unfit}") if unfit else name, count))
            ids.append(f"{name}-{count or default_devices}{accelerator}")
    metafunc.parametrize(xdist.ARGNAMES, params, ids=ids, scope="function")


def _strategy_names(item: pytest.Item, where: str) -> list[str]:
    names: list[str] = []
    for marker in item.iter_markers(STRATEGY_MARKER):
        if marker.kwargs:
            keywords = ", ".join(marker.kwargs)
            raise SettingError(
                f"{where}: strategy marker takes names only, got keyword(s) {keywords}"
            )
        names.extend(marker.args)
    names, valid = names or ["auto"], strategy_names()
    for name in names:
        if name not in valid:
            raise SettingError(
                f"{where}: unknown strategy {name!r} in @pytest.mark.strategy; "
                f"valid: {', '.join(valid)}"
            )
    if len(set(names)) != len(names):
        raise SettingError(f"{where}: strategy marker repeats a name: {names}")
    return names


def _device_counts(item: pytest.Item, where: str) -> list[int | None]:
    """Rank counts from @pytest.mark.devices(1, 2, 4); [None] (the session's) without it."""
    marker = item.get_closest_marker(DEVICES_MARKER)
    if marker is None:
        return [None]
    counts = list(marker.args)
    bad = [c for c in counts if isinstance(c, bool) or not isinstance(c, int) or c < 1]
    if marker.kwargs or not counts or bad:
        raise SettingError(
            f"{where}: @pytest.mark.devices takes positive integers (rank counts), got "
            f"{', '.join(map(repr, [*counts, *marker.kwargs.items()])) or 'nothing'}"
        )
    if len(set(counts)) != len(counts):
        raise SettingError(f"{where}: devices marker repeats a count: {counts}")
    return counts


def _rank_count(item: pytest.Item, default: int) -> int:
    """A distperf item's rank count; 0 for any other item."""
    if not xdist.is_distperf(item):
        return 0
    return item.callspec.params["distperf_devices"] or default  # type: ignore[attr-defined]


def workloads_by_count(
    items: list[pytest.Item], default_devices: int
) -> dict[int, list[tuple[str, Workload]]]:
    """rank count -> (strategy, workload) of every valid distperf item among `items`."""
    workloads: dict[int, list[tuple[str, Workload]]] = {}
    for item in filter(xdist.is_distperf, items):
        strategy = item.callspec.params["distperf_strategy"]  # type: ignore[attr-defined]
        if not isinstance(strategy, Invalid):
            pairs = workloads.setdefault(_rank_count(item, default_devices), [])
            pairs.append((strategy, workload_of(item)))
    return workloads


def prepare(config: pytest.Config, items: list[pytest.Item], default_devices: int) -> None:
    """Order the items by rank count; mark them to fail where xdist cannot keep them together."""
    if len({_rank_count(item, default_devices) for item in filter(xdist.is_distperf, items)}) > 1:
        # One pool per rank count: run each count's tests together, so pools switch rarely.
        items.sort(key=lambda item: _rank_count(item, default_devices))
    refused = xdist.refusal(config)
    if refused:
        for item in filter(xdist.is_distperf, items):
            item.stash[REFUSED] = refused


def check_item(item: pytest.Item, strategy: Any) -> None:
    """Fail this item at setup when its markers are bad or xdist would misplace it."""
    if isinstance(strategy, Invalid):
        pytest.fail(strategy.message, pytrace=False)
    refused = item.stash.get(REFUSED, None)
    if refused:
        pytest.fail(refused, pytrace=False)


def check_supported(
    item: pytest.Item, strategy: str, accelerator: str, devices: int, marked: bool
) -> None:
    """Before any rank starts: a rank count the test's own devices marker asks for (`marked`)
    that the strategy can never run with fails; what the session chose (accelerator,
    --distperf-devices) may suit it on another machine, so that skips."""
    record = get_strategy(strategy)
    reason = record.unsupported(accelerator, devices)
    if reason and marked and accelerator in record.runs_on:
        pytest.fail(f"distperf: {item.nodeid}: {reason}", pytrace=False)
    if reason:
        pytest.skip(f"distperf: {reason}")


def marker_kwargs(item: pytest.Item) -> dict[str, Any]:
    marker = item.get_closest_marker(WORKLOAD_MARKER)
    if marker and marker.args:
        raise SettingError(f"{item.nodeid}: distperf marker takes keyword arguments only")
    return dict(marker.kwargs) if marker else {}


def workload_of(item: pytest.Item) -> Workload:
    """The item's workload from its distperf marker; SettingError naming the test and value."""
    from distperf_model.config import PRESETS

    workload = workload_from_marker(marker_kwargs(item), item.nodeid, tuple(PRESETS))
    check_fits(workload, item.nodeid, test_dir(item))
    return workload


def test_dir(item: pytest.Item) -> str:
    """The test file's folder: where a relative `distperf(model="hf:<config>")` starts."""
    path = getattr(item, "path", None)
    return str(path.parent) if path is not None else ""


def check_fits(workload: Workload, where: str, test_dir: str = "") -> None:
    """The KV cache must hold the prompt and every new token (and the reference's steps) within
    the named model's context (an `hf:` config found from `test_dir`); a builder's: by its ranks."""
    from pytest_distperf.models import ModelError, context_limit
    from pytest_distperf.spec import RunSpec

    try:
        block_size = context_limit(workload.model, test_dir)
    except ModelError as error:
        raise SettingError(f"{where}: distperf(model={workload.model!r}): {error}") from None
    if block_size is None:
        return
    if workload.training:
        length = workload.seq_length or 0
        if length > block_size:
            raise SettingError(
                f"{where}: distperf(seq_length={length}) exceeds block_size={block_size} of "
                f"model {workload.model!r}"
            )
        return
    steps = max(workload.max_new_tokens, RunSpec.reference_steps)
    if workload.prompt_length + steps > block_size:
        raise SettingError(
            f"{where}: distperf(prompt_length={workload.prompt_length}, "
            f"max_new_tokens={workload.max_new_tokens}) needs {workload.prompt_length + steps} "
            f"positions but model {workload.model!r} has block_size={block_size}"
        )


def strategy_unfit(strategy: str, workload: Workload, devices: int) -> str | None:
    """Why `strategy` cannot split the workload's model over `devices` ranks (tp's heads,
    pipeline's blocks), or None; a builder's model is its ranks' to check, a bad name check_fits."""
    from pytest_distperf.models import ModelError, shape_of

    record = get_strategy(strategy)
    if workload.training and record.train_refusal:
        return f"strategy {strategy!r} cannot train: {record.train_refusal}"
    try:
        shape = shape_of(workload.model)
    except (ModelError, ValueError, ImportError):
        return None
    reason = record.check(shape, devices) if shape is not None else None
    return f"distperf(model={workload.model!r}): {reason}" if reason else None
