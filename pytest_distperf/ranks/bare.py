"""The bare model a rank runs beside the wrapped generations: no wrapper, no collectives (made
in ranks/bare_phases.py). Its memory stays out of the reported peak."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pytest_distperf.measured import Sample
from pytest_distperf.ranks.timing import Fences, GenerateFn, device_sync, timed_generation

if TYPE_CHECKING:
    from pytest_distperf.ranks.compiled import CompiledStep


@dataclass(eq=False)
class BareCopy:
    """The bare model and its bookkeeping; `module` None: no bare generation (none asked for,
    none fitted, or dropped after running out of memory)."""

    module: torch.nn.Module | None
    prompt: torch.Tensor
    max_new_tokens: int
    generate: GenerateFn | None = None
    copy_bytes: int = 0  # a CUDA copy's own bytes, taken out of the peak
    rss_before_copy: int | None = None  # a CPU rank's RSS peak before the copy existed
    steps: CompiledStep | None = None  # its compiled steps (compile phase), if any
    wrapped_peaks: list[int] = field(default_factory=list)  # each wrapped run's, copy excluded

    def generation(self, tokens: int | None = None) -> Sample | None:
        """One bare generation of `tokens` new tokens (default: the run's), timed; None without a
        model or when it ran out of memory. A copy's allocator peak is read before and reset
        after it: the wrapped run's stays."""
        if self.module is None:
            return None
        device = self.prompt.device
        if self.copy_bytes:
            self.wrapped_peaks.append(torch.cuda.max_memory_allocated(device) - self.copy_bytes)
        fences = Fences(sync=device_sync(device), barrier=lambda: None)
        steps = self.steps.override() if self.steps is not None else None
        try:
            sample: Sample | None = timed_generation(
                self.module,
                self.prompt,
                tokens or self.max_new_tokens,
                fences,
                generate=self.generate,
                steps=steps,
            )[0]
        except torch.cuda.OutOfMemoryError:
            sample = None
        if sample is None:  # out of memory: drop the copy (and its compiled steps' hold on it)
            self.module, self.steps, self.copy_bytes = None, None, 0
            torch.cuda.empty_cache()
        elif self.copy_bytes:
            torch.cuda.reset_peak_memory_stats(device)
        return sample

    def reported_peak(self, peak: int, kind: str) -> tuple[int, str]:
        """The rank's (peak bytes, what they are) with the copy's memory left out."""
        if self.wrapped_peaks:
            # With the copy dropped mid-run, the plain peak since then may still hold part of
            # the bare run that failed: a slight overestimate in a rare case.
            alive = self.module is not None
            peak = max(self.wrapped_peaks) if alive else max(peak, *self.wrapped_peaks)
        if self.rss_before_copy is not None:
            return self.rss_before_copy, f"{kind} (before the bare copy was built)"
        return peak, kind
