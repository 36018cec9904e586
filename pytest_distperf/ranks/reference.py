"""Which single-process reference a run reports, and where it is timed (pure: figures only).

Where the relative speed is measured, the bare model runs one generation after every timed one:
the host's speed moves both alike, so their ratio holds where tokens/sec does not
(docs/benchmarks/h200-2026-11-30.md). Elsewhere a replicated model's own module is timed after
the repeats, and a sharded model is timed until steady before wrapping.
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
    """Bare generations timed after the repeats (a replicated model's reference where none ran
    beside them): `reference_steps` decode steps in all; 0 where a generation has none."""
    if sharded or beside or not reference_steps or max_new_tokens < 2:
        return 0
    return math.ceil(reference_steps / max_new_tokens)


def tokens_after(max_new_tokens: int, reference_steps: int, own_loop: bool) -> int:
    """New tokens of each generation timed after the repeats: the built-in step reads the whole
    static cache at any position, so `reference_steps` suffice; a user's loop is timed whole."""
    return max_new_tokens if own_loop else min(max_new_tokens, reference_steps + 1)


def times_before_wrapping(
    sharded: bool, beside: bool, max_new_tokens: int, reference_steps: int, copied: bool = False
) -> bool:
    """Whether the unwrapped model is timed before wrapping: a sharded one's reference unless
    its whole copy runs beside the repeats (`copied`), or a replicated one's whose generation
    has no decode step to time after them."""
    if not reference_steps or copied:
        return False
    return sharded or (not beside and max_new_tokens < 2)


def choose_reference(
    sharded: bool,
    max_new_tokens: int,
    compiled_loop: bool,
    bare_samples: Sequence[Sample],
    after_samples: Sequence[Sample],
    before_wrap: tuple[float, float | None] | None,
    after_tokens: int | None = None,
) -> ReferenceChoice:
    """The reference of a run from the bare generations beside the timed ones, those timed
    after them (of `after_tokens` new tokens each), or (step s, prefill s) before wrapping."""
    token_s, prefill_s = before_wrap if before_wrap is not None else (None, None)
    source = BEFORE_WRAPPING if before_wrap is not None else ""
    if bare_samples and (not sharded or compiled_loop or before_wrap is None):
        token_s, source = _median_step(bare_samples, max_new_tokens), BESIDE
    elif after_samples and not sharded:
        token_s, source = _median_step(after_samples, after_tokens or max_new_tokens), AFTER
    prefills = [s.ttft_s for s in bare_samples or after_samples if s.ttft_s is not None]
    if bare_samples or after_samples:  # the bare runs' prefill, else the one before wrapping
        prefill_s = statistics.median(prefills) if prefills else None
    eager = compiled_loop and source == BEFORE_WRAPPING
    return ReferenceChoice(token_s, prefill_s, eager, source)


def _median_step(samples: Sequence[Sample], max_new_tokens: int) -> float:
    return statistics.median(step_seconds(s, max_new_tokens) for s in samples)


def step_seconds(sample: Sample, steps: int) -> float:
    """Seconds per decode step of a generation of `steps` new tokens (a user's loop, with no
    split known: its whole time over its tokens)."""
    if sample.decode_s is None:
        return sample.total_s / steps
    return sample.decode_s / max(steps - 1, 1)
