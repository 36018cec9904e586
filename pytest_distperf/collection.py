"""From collected tests to distperf items: parametrisation, order, xdist grouping; a bad marker
fails only its own test, at setup (an `Invalid` parameter carries the message). No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pytest_distperf import markers, xdist
from pytest_distperf.items import ARGNAMES, is_distperf
from pytest_distperf.spec import Workload
from pytest_distperf.strategies import get_strategy

INVALID_ID = "invalid-marker"
REFUSED = pytest.StashKey[str]()  # why this item must not start ranks here (xdist)


@dataclass(frozen=True)
class Invalid:
    """The `distperf_strategy` parameter of a test whose markers are bad."""

    message: str


def parametrize(metafunc: pytest.Metafunc, accelerator: str, default_devices: int) -> None:
    """One item per (strategy, rank count), ids like `fsdp-2cpu`; one failing item when the
    markers are bad."""
    where = metafunc.definition.nodeid
    try:
        names = markers.strategy_names_of(metafunc, where)
        counts = markers.device_counts_of(metafunc, where)
        workload = markers.workload_of(metafunc.definition)
    except pytest.fail.Exception as error:
        metafunc.parametrize(
            ARGNAMES, [(Invalid(error.msg), None)], ids=[INVALID_ID], scope="function"
        )
        return
    params, ids = [], []
    for name in names:
        for count in counts:
            unfit = markers.strategy_unfit(name, workload, count or default_devices)
            params.append((Invalid(f"{where}: {unfit}") if unfit else name, count))
            ids.append(f"{name}-{count or default_devices}{accelerator}")
    metafunc.parametrize(ARGNAMES, params, ids=ids, scope="function")


def distperf_params(item: pytest.Item) -> tuple[str, int | None] | None:
    """(strategy, rank count or None) of a valid distperf item; None for any other item."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    strategy = params.get("distperf_strategy")
    if strategy is None or isinstance(strategy, Invalid):
        return None
    return strategy, params["distperf_devices"]


def workloads_by_count(
    items: list[pytest.Item], default_devices: int
) -> dict[int, list[tuple[str, Workload]]]:
    """rank count -> (strategy, workload) of every valid distperf item among `items`."""
    workloads: dict[int, list[tuple[str, Workload]]] = {}
    for item in items:
        found = distperf_params(item)
        if found is not None:
            strategy, count = found
            workloads.setdefault(count or default_devices, []).append(
                (strategy, markers.workload_of(item))
            )
    return workloads


def prepare(config: pytest.Config, items: list[pytest.Item], default_devices: int) -> None:
    """Order the items by rank count; mark them to fail where xdist cannot keep them together."""
    counts = {markers.item_devices(item, default_devices) for item in items if is_distperf(item)}
    if len(counts) > 1:
        # One pool per rank count: run each count's tests together, so pools switch rarely.
        items.sort(key=lambda item: markers.item_devices(item, default_devices))
    refused = xdist.refusal(config)
    if refused:
        for item in filter(is_distperf, items):
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
