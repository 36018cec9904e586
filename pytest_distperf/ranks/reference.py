"""Which single-process reference a run reports, and where it is timed: the bare model's
generations beside the samples, the bare model timed after them, or the whole model timed before
wrapping. Pure (no torch): decided from figures only.

Where the relative speed is measured (StrategyRecord.measures_relative_speed), the bare model
(no wrapper, no collectives) runs one generation right after every timed one: the host's own
speed may switch between levels within seconds (docs/benchmarks/h200-2026-11-30.md), which moves
the wrapped and the bare run alike, so their ratio stays put where tokens/sec does not. A
replicated model is the bare one behind a forward wrapper: its reference is those generations,
or without them its own module timed after the repeats (warm, the same caches), a few
generations of at least `reference_steps` decode steps in all. A sharded model's reference is its
whole copy beside the samples (copied before wrapping where memory is an RSS heap, built again
after it where it fits); where no copy is expected to fit, the model is timed until steady
before wrapping, and a copy dropped mid-run leaves the run without a reference (the threshold's
compute term is then the roofline's). Compiled, the reference is the compiled bare model beside
the samples, never the eager one timed before wrapping, unless no copy ran beside them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_distperf.measured import Sample


@dataclass(frozen=True)
class ReferenceChoice:
    """The reference a rank reports; None where it has none."""

    token_s: float | None  # seconds per decode step of the bare model
    prefill_s: float | None  # seconds of its prefill (None for a user's own loop)
    eager: bool  # a compiled run whose reference is the eager model's (no compiled copy ran)
    source: str = ""  # how token_s was obtained (BESIDE, AFTER, BEFORE_WRAPPING); "" where none


BESIDE = "the bare model beside each timed generation"
AFTER = "the bare model timed after the timed generations"
BEFORE_WRAPPING = "the unwrapped model timed until steady before wrapping"


def generations_after(
    sharded: bool, beside: bool, max_new_tokens: int, reference_steps: int
) -> int:
    """How many bare generations are timed after the repeats: a replicated model's reference
    where none ran beside them, at least `reference_steps` tokens in all, as many as the
    reference timed before wrapping generated (0: none; a generation of one token has no
    decode step to time)."""
    if sharded or beside or not reference_steps or max_new_tokens < 2:
        return 0
    return math.ceil(reference_steps / max_new_tokens)


def tokens_after(max_new_tokens: int, reference_steps: int, own_loop: bool) -> int:
    """New tokens of each generation timed after the repeats: the built-in loop's step reads
    the whole static cache whatever its position, so `reference_steps` decode steps suffice;
    a user's loop is timed whole, as the repeats ran it."""
    return max_new_tokens if own_loop else min(max_new_tokens, reference_steps + 1)


def times_before_wrapping(
    sharded: bool, beside: bool, max_new_tokens: int, reference_steps: int, copied: bool = False
) -> bool:
    """Whether the unwrapped model is timed until steady before wrapping: a sharded model's
    reference, unless its whole copy runs beside the repeats (`copied`: taken before wrapping,
    or built again after it where it is expected to fit), or a replicated one's whose
    generation is too short to time after the repeats."""
    if not reference_steps or copied:
        return False
    return sharded or (not beside and not generations_after(False, False, max_new_tokens, 1))


def choose_reference(
    sharded: bool,
    max_new_tokens: int,
    compiled_loop: bool,
    bare_samples: Sequence[Sample],
    after_samples: Sequence[Sample],
    before_wrap: tuple[float, float | None] | None,
    after_tokens: int | None = None,
) -> ReferenceChoice:
    """The reference of a run.

    `compiled_loop`: the timed loop ran compiled steps; `bare_samples`: the bare generations
    beside every timed one (empty when there were none, or fewer than the samples);
    `after_samples`: the bare generations timed after the repeats, of `after_tokens` new tokens
    each (default `max_new_tokens`); `before_wrap`: (seconds per step, prefill seconds) timed
    before wrapping, or None.
    """
    token_s, prefill_s = before_wrap if before_wrap is not None else (None, None)
    source = BEFORE_WRAPPING if before_wrap is not None else ""
    if bare_samples and (not sharded or compiled_loop or before_wrap is None):
        token_s, source = _median_step(bare_samples, max_new_tokens), BESIDE
    elif after_samples and not sharded:
        token_s, source = _median_step(after_samples, after_tokens or max_new_tokens), AFTER
    # The bare runs' prefill; with none, the one timed before wrapping.
    timed_bare = bare_samples or after_samples
    if timed_bare:
        prefill_s = median_prefill(timed_bare)
    eager = compiled_loop and source == BEFORE_WRAPPING
    return ReferenceChoice(token_s, prefill_s, eager, source)


def _median_step(samples: Sequence[Sample], max_new_tokens: int) -> float:
    return statistics.median(step_seconds(s, max_new_tokens) for s in samples)


def step_seconds(sample: Sample, steps: int) -> float:
    """Seconds per decode step of one generation of `steps` new tokens: its decode time over
    the decode steps, or for a user's loop (no split known) its whole time over its tokens."""
    if sample.decode_s is None:
        return sample.total_s / steps
    return sample.decode_s / max(steps - 1, 1)


def median_prefill(samples: Sequence[Sample]) -> float | None:
    prefills = [s.ttft_s for s in samples if s.ttft_s is not None]
    return statistics.median(prefills) if prefills else None
