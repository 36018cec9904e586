"""What a distperf test asks for, read from its markers at collection (no torch); bad values fail
with the test's node id, the value and the valid choices."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_distperf.options import SettingError, workload_from_marker
from pytest_distperf.spec import Workload
from pytest_distperf.strategies import strategy_names

STRATEGY_MARKER = "strategy"
DEVICES_MARKER = "devices"
WORKLOAD_MARKER = "distperf"


def register(config: pytest.Config) -> None:
    """Marker help for `pytest --markers`, and for --strict-markers."""
    for text in (
        f"{STRATEGY_MARKER}(*names): run this distperf test once per parallel strategy; "
        f"names: {', '.join(strategy_names())}",
        f"{DEVICES_MARKER}(*counts): run this distperf test once per rank count, e.g. "
        "devices(1, 2, 4); without it, --distperf-devices",
        f"{WORKLOAD_MARKER}(model='tiny', max_new_tokens=32, prompt_length=8, batch_size=1, "
        "precision='fp32', seed=1234, slowdown=0.0, generate=None, shard_unit=None, "
        "tp_plan=None, comm_delay=0.0, compile=None, efficiency=None, tolerance=None, "
        "gates=None, work_tolerance=None, relative_speed=None, mode='generate', "
        "seq_length=None): the workload a distperf test generates (mode='train': optimizer "
        "steps on batch_size sequences of seq_length tokens), and its per-test gate settings "
        "(gates=False: measured and reported, never failed by a check; relative_speed=True: "
        "the bare model timed beside a replicated strategy's repeats too)",
    ):
        config.addinivalue_line("markers", text)


def strategy_names_of(metafunc: pytest.Metafunc, where: str) -> list[str]:
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


def device_counts_of(metafunc: pytest.Metafunc, where: str) -> list[int | None]:
    """Rank counts from @pytest.mark.devices(1, 2, 4); [None] (the session's) without it."""
    marker = metafunc.definition.get_closest_marker(DEVICES_MARKER)
    if marker is None:
        return [None]
    counts = list(marker.args)
    bad = [c for c in counts if isinstance(c, bool) or not isinstance(c, int) or c < 1]
    if marker.kwargs or not counts or bad:
        pytest.fail(
            f"{where}: @pytest.mark.devices takes positive integers (rank counts), got "
            f"{', '.join(map(repr, [*counts, *marker.kwargs.items()])) or 'nothing'}",
            pytrace=False,
        )
    if len(set(counts)) != len(counts):
        pytest.fail(f"{where}: devices marker repeats a count: {counts}", pytrace=False)
    return counts


def item_devices(item: pytest.Item, default: int) -> int:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "distperf_strategy" not in params:
        return 0
    return params["distperf_devices"] or default


def known_models() -> tuple[str, ...]:
    from distperf_model.config import PRESETS

    return tuple(PRESETS)


def marker_kwargs(item: pytest.Item) -> dict[str, Any]:
    marker = item.get_closest_marker(WORKLOAD_MARKER)
    if marker and marker.args:
        pytest.fail(f"{item.nodeid}: distperf marker takes keyword arguments only", pytrace=False)
    return dict(marker.kwargs) if marker else {}


def workload_of(item: pytest.Item) -> Workload:
    kwargs = marker_kwargs(item)
    try:
        workload = workload_from_marker(kwargs, item.nodeid, known_models())
        check_fits(workload, item.nodeid, test_dir(item))
        return workload
    except SettingError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)  # outside `except`: no chained duplicate in the report


def test_dir(item: pytest.Item) -> str:
    """The test file's folder: where a relative `distperf(model="hf:<config>")` starts."""
    path = getattr(item, "path", None)
    return str(path.parent) if path is not None else ""


def check_fits(workload: Workload, where: str, test_dir: str = "") -> None:
    """The KV cache must hold the prompt and every new token (and the reference's steps), within
    the model's own context: a preset's or LitGPT config's `block_size`, an HF config's
    `max_position_embeddings` (its file found from `test_dir` here: a missing one fails the
    test now). A builder's model is checked by its ranks, once built (its `config.block_size`,
    or a `max_seq_length` it set)."""
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
    """Why `strategy` cannot split the workload's model over `devices` ranks (its record's
    `check`: tp's heads, pipeline's blocks), or None; a builder's model is checked by its ranks
    once built, and a bad model name is `check_fits`'s to report."""
    from pytest_distperf.models import ModelError, shape_of
    from pytest_distperf.strategies import get_strategy

    record = get_strategy(strategy)
    if workload.training and record.train_refusal:
        return f"strategy {strategy!r} cannot train: {record.train_refusal}"
    try:
        shape = shape_of(workload.model)
    except (ModelError, ValueError, ImportError):
        return None
    reason = record.check(shape, devices) if shape is not None else None
    return f"distperf(model={workload.model!r}): {reason}" if reason else None
