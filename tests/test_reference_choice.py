"""Which single-process reference a rank reports (ranks/reference.py): pure, no ranks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pytest_distperf.measured import Sample
from pytest_distperf.ranks import reference
from pytest_distperf.ranks.reference import (
    AFTER,
    BEFORE_WRAPPING,
    BESIDE,
    ReferenceChoice,
    choose_reference,
    generations_after,
    step_seconds,
    times_before_wrapping,
    tokens_after,
)

STEPS = 8  # RunSpec.reference_steps' default
BEFORE = (0.5, 0.25)  # (seconds per step, prefill seconds) timed before wrapping


def _bare(decode_s: float, ttft_s: float | None = 0.1, total_s: float = 9.0) -> Sample:
    return Sample(total_s=total_s, ttft_s=ttft_s, decode_s=decode_s if ttft_s else None)


@pytest.mark.parametrize(
    ("sharded", "beside", "max_new_tokens", "reference_steps", "after", "before"),
    [
        (False, True, 50, STEPS, 0, False),  # relative speed asked: the bare model beside
        (False, False, 50, STEPS, 1, False),  # replicated: one generation after the repeats
        (False, False, 8, STEPS, 1, False),
        (False, False, 3, STEPS, 3, False),  # short: enough of them for 8 tokens
        (False, False, 1, STEPS, 0, True),  # no decode step to time after: before wrapping
        (True, True, 50, STEPS, 0, True),  # sharded: the whole model, timed before wrapping
        (False, False, 50, 0, 0, False),  # no reference asked for: nothing timed
        (True, True, 50, 0, 0, False),
    ],
)
def test_where_the_reference_is_timed(
    sharded: bool, beside: bool, max_new_tokens: int, reference_steps: int, after: int, before: bool
) -> None:
    assert generations_after(sharded, beside, max_new_tokens, reference_steps) == after
    assert times_before_wrapping(sharded, beside, max_new_tokens, reference_steps) is before


def test_a_sharded_copy_taken_before_wrapping_is_the_reference_beside_the_samples() -> None:
    # CPU ranks: the whole copy cannot run out of memory there, so it runs beside every repeat
    # and nothing is timed before wrapping.
    assert not times_before_wrapping(True, True, 50, STEPS, copied=True)
    chosen = choose_reference(True, 50, False, [_bare(4.9, 0.3), _bare(9.8, 0.1)], [], None)
    assert chosen.token_s == pytest.approx(0.15) and chosen.source == BESIDE
    assert chosen.prefill_s == pytest.approx(0.2) and not chosen.eager


def test_replicated_takes_the_median_of_the_bare_runs_beside_the_samples() -> None:
    bare = [_bare(4.9, 0.3), _bare(9.8, 0.1), _bare(2.45, 0.2)]  # 50 tokens: 49 decode steps
    chosen = choose_reference(False, 50, False, bare, [], None)
    assert chosen == ReferenceChoice(pytest.approx(0.1), prefill_s=0.2, eager=False, source=BESIDE)


def test_replicated_without_the_bare_model_beside_takes_it_timed_after_the_repeats() -> None:
    chosen = choose_reference(False, 50, False, [], [_bare(4.9, 0.3)], None)
    assert chosen == ReferenceChoice(pytest.approx(0.1), prefill_s=0.3, eager=False, source=AFTER)
    # compiled: the bare module's own compiled steps ran after the repeats, not an eager copy
    assert not choose_reference(False, 50, True, [], [_bare(4.9)], None).eager


def test_after_the_repeats_the_built_in_loop_times_only_the_reference_steps() -> None:
    # Its step reads the whole static cache at any position: 8 decode steps are as good as 49.
    assert tokens_after(50, STEPS, own_loop=False) == STEPS + 1
    assert tokens_after(8, STEPS, own_loop=False) == 8
    assert tokens_after(50, STEPS, own_loop=True) == 50  # a user's loop, timed whole
    chosen = choose_reference(False, 50, False, [], [_bare(0.8, 0.3)], None, after_tokens=9)
    assert chosen == ReferenceChoice(pytest.approx(0.1), prefill_s=0.3, eager=False, source=AFTER)


def test_sharded_keeps_the_reference_timed_before_wrapping() -> None:
    bare = [_bare(4.9), _bare(4.9)]  # the whole copy beside the samples: its prefill only
    chosen = choose_reference(True, 50, False, bare, [], BEFORE)
    assert chosen == ReferenceChoice(0.5, prefill_s=0.1, eager=False, source=BEFORE_WRAPPING)


def test_sharded_without_a_copy_beside_keeps_both_figures_from_before_wrapping() -> None:
    chosen = choose_reference(True, 50, False, [], [], BEFORE)
    assert chosen == ReferenceChoice(0.5, 0.25, False, BEFORE_WRAPPING)


def test_a_one_token_generation_keeps_the_reference_timed_before_wrapping() -> None:
    chosen = choose_reference(False, 1, False, [], [], BEFORE)
    assert chosen == ReferenceChoice(0.5, 0.25, False, BEFORE_WRAPPING)


def test_compiled_takes_the_compiled_bare_runs_even_when_sharded() -> None:
    chosen = choose_reference(True, 50, True, [_bare(0.98), _bare(0.98)], [], BEFORE)
    assert chosen.token_s == pytest.approx(0.02) and not chosen.eager and chosen.source == BESIDE


def test_compiled_without_a_copy_beside_says_its_reference_is_eager() -> None:
    chosen = choose_reference(True, 50, True, [], [], BEFORE)
    assert chosen == ReferenceChoice(0.5, 0.25, True, BEFORE_WRAPPING)


def test_no_reference_at_all() -> None:
    assert choose_reference(False, 50, False, [], [], None) == ReferenceChoice(None, None, False)
    # Compiled with nothing to compare against: nothing is eager either.
    assert choose_reference(True, 50, True, [], [], None) == ReferenceChoice(None, None, False)


def test_a_users_own_loop_is_timed_per_token_and_has_no_prefill() -> None:
    own = [_bare(0.0, ttft_s=None, total_s=5.0), _bare(0.0, ttft_s=None, total_s=6.0)]
    chosen = choose_reference(False, 50, False, own, [], None)
    assert chosen.token_s == pytest.approx(5.5 / 50) and chosen.prefill_s is None
    assert step_seconds(own[0], 50) == pytest.approx(0.1)


def test_one_step_generation_divides_by_one() -> None:
    assert step_seconds(Sample(total_s=1.0, ttft_s=0.5, decode_s=0.5), 1) == 0.5


def test_the_choice_imports_no_torch() -> None:
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
    }
    assert "torch" not in imported
