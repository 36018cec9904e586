"""Which single-process reference a run reports: the bare model's generations timed beside the
samples, or the reference timed before wrapping. Pure (no torch): decided from figures only.

The bare model (no wrapper, no collectives) runs one generation right after every timed one:
the host's own speed may switch between levels within seconds (docs/benchmarks/
h200-2026-11-30.md), which moves the wrapped and the bare run alike, so their ratio stays put
where tokens/sec does not. A replicated model is timed beside its samples; a sharded model (and
a generation too short to time a reference beside it, a step or two of a tiny model being all
noise, unless the ranks time themselves: the reference then judges nothing) is timed until
steady before wrapping. Compiled, the reference is the compiled bare model
beside the samples, never the eager one timed before wrapping, unless no copy ran beside them.
"""

from __future__ import annotations

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
    source: str = ""  # how token_s was obtained (BESIDE, BEFORE_WRAPPING); "" where none


BESIDE = "the bare model beside each timed generation"
BEFORE_WRAPPING = "the unwrapped model timed until steady before wrapping"


def pairs_beside(
    sharded: bool, max_new_tokens: int, reference_steps: int, retimed: bool = False
) -> bool:
    """Whether the reference is the bare generations beside the samples (else the one timed
    before wrapping, when there is one). `retimed`: the ranks time themselves, so the reference
    judges nothing and a short generation's noisy bare steps are not worth a timing of their own."""
    return not sharded and (max_new_tokens > reference_steps or retimed)


def times_before_wrapping(
    sharded: bool, max_new_tokens: int, reference_steps: int, retimed: bool = False
) -> bool:
    """Whether the unwrapped model is timed until steady before wrapping."""
    beside = pairs_beside(sharded, max_new_tokens, reference_steps, retimed)
    return bool(reference_steps) and not beside


def choose_reference(
    sharded: bool,
    max_new_tokens: int,
    reference_steps: int,
    compiled_loop: bool,
    bare_samples: Sequence[Sample],
    before_wrap: tuple[float, float | None] | None,
    retimed: bool = False,
) -> ReferenceChoice:
    """The reference of a run.

    `compiled_loop`: the timed loop ran compiled steps; `bare_samples`: the bare generations
    beside every timed one (empty when there were none, or fewer than the samples);
    `before_wrap`: (seconds per step, prefill seconds) timed before wrapping, or None.
    """
    token_s, prefill_s = before_wrap if before_wrap is not None else (None, None)
    source = BEFORE_WRAPPING if before_wrap is not None else ""
    paired = pairs_beside(sharded, max_new_tokens, reference_steps, retimed)
    if (paired or compiled_loop) and bare_samples:
        token_s = statistics.median(step_seconds(s, max_new_tokens) for s in bare_samples)
        source = BESIDE
    # The bare runs' prefill; with no copy beside the run, the one timed before wrapping.
    if bare_samples:
        prefill_s = median_prefill(bare_samples)
    eager = compiled_loop and token_s is not None and not bare_samples
    return ReferenceChoice(token_s, prefill_s, eager, source)


def step_seconds(sample: Sample, steps: int) -> float:
    """Seconds per decode step of one generation of `steps` new tokens: its decode time over
    the decode steps, or for a user's loop (no split known) its whole time over its tokens."""
    if sample.decode_s is None:
        return sample.total_s / steps
    return sample.decode_s / max(steps - 1, 1)


def median_prefill(samples: Sequence[Sample]) -> float | None:
    prefills = [s.ttft_s for s in samples if s.ttft_s is not None]
    return statistics.median(prefills) if prefills else None
