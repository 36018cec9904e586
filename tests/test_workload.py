"""Timing helpers of the rank-side workload that need no process group."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pytest_distperf.ranks.timing import steady_median


def _sequence(values: list[float]) -> tuple[Callable[[], float], Iterator[float]]:
    it = iter(values)
    return lambda: next(it), it


def test_stops_once_the_figure_stops_improving() -> None:
    # a device warming up: three slow figures, then steady ones
    measure, rest = _sequence([3.0, 2.5, 1.0, 1.01, 0.995, 1.02, 99.0])
    steady, calls = steady_median(measure, patience=3, max_repeats=10)
    assert calls == 6
    assert steady == pytest.approx(1.005)  # median of the steady stretch 1.0, 1.01, 0.995, 1.02
    assert next(rest) == 99.0  # nothing measured beyond the stop


def test_a_lucky_fast_repeat_does_not_set_the_figure() -> None:
    measure, _ = _sequence([1.0, 0.6, 1.0, 1.05, 0.98])
    steady, calls = steady_median(measure, patience=3, max_repeats=10)
    assert calls == 5 and steady == pytest.approx(0.99)  # not 0.6


def test_a_new_best_restarts_the_patience() -> None:
    measure, _ = _sequence([2.0, 2.0, 2.0, 1.5, 1.5, 1.5, 1.5])
    assert steady_median(measure, patience=3, max_repeats=10) == (1.5, 7)


def test_never_more_than_max_repeats() -> None:
    measure, _ = _sequence([10.0, 9.0, 8.0, 7.0, 6.0, 5.0])
    assert steady_median(measure, patience=2, max_repeats=4) == (8.0, 4)


def test_every_rank_makes_as_many_calls_as_the_last_one_done() -> None:
    # steady after 6 calls here, but a peer is done only after 8: a model whose forward issues
    # its own collectives would leave that peer waiting if this rank stopped first
    measure, rest = _sequence([3.0, 2.5, 1.0, 1.01, 0.995, 1.02, 1.0, 1.0, 99.0])
    asked: list[bool] = []

    def all_done(done: bool) -> bool:
        asked.append(done)
        return done and len(asked) >= 8

    steady, calls = steady_median(measure, patience=3, max_repeats=10, all_done=all_done)
    assert calls == 8 and next(rest) == 99.0
    assert asked[:5] == [False] * 5 and all(asked[5:])  # its own verdict went to the vote
    assert steady == pytest.approx(1.0)
