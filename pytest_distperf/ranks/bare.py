"""The bare model a rank runs beside every wrapped generation: no wrapper, no collectives.

A replicated model is the same object after wrapping; a sharded one is copied whole before
wrapping where memory is an RSS heap (CPU ranks; a preset's or LitGPT's model), else rebuilt
whole from the seed after it (its own KV cache too), kept only where it fits, dropped when it
runs out of memory. Its
memory stays out of the reported peak: its bytes come off each wrapped generation's allocator
peak, or the RSS peak is the one read before it was built.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from pytest_distperf.measured import Sample
from pytest_distperf.platform import platform_of
from pytest_distperf.ranks import memory
from pytest_distperf.ranks.models import RankModel, build
from pytest_distperf.ranks.timing import Fences, GenerateFn, device_sync, timed_generation
from pytest_distperf.spec import Workload

if TYPE_CHECKING:
    from pytest_distperf.ranks.compiled import CompiledStep


class BareCopy:
    """The bare model and its bookkeeping; `module` None: no bare generation (none asked for,
    none fitted, or dropped after running out of memory)."""

    def __init__(
        self,
        module: torch.nn.Module | None,
        prompt: torch.Tensor,
        max_new_tokens: int,
        generate: GenerateFn | None = None,
        copy_bytes: int = 0,
        rss_before_copy: int | None = None,
    ) -> None:
        self.module = module
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.generate = generate
        self.copy_bytes = copy_bytes  # a CUDA copy's own bytes, taken out of the peak
        self.rss_before_copy = rss_before_copy  # a CPU rank's RSS peak before the copy existed
        self.steps: CompiledStep | None = None  # its compiled steps (compile phase), if any
        self.wrapped_peaks: list[int] = []  # allocator peak of each wrapped run, copy excluded
        self._device = prompt.device
        self._fences = Fences(sync=device_sync(self._device), barrier=lambda: None)

    @classmethod
    def whole(
        cls,
        workload: Workload,
        prompt: torch.Tensor,
        dtype: torch.dtype,
        generate: GenerateFn | None = None,
    ) -> BareCopy:
        """A sharded rank's whole copy, built once wrapping has freed the unsharded weights."""
        device = prompt.device
        rss = None if platform_of(device.type).allocator_memory else memory.peak(device)[0]
        module, copy_bytes = _whole_copy(workload, device, dtype)
        return cls(module, prompt, workload.max_new_tokens, generate, copy_bytes, rss)

    @classmethod
    def copied(
        cls,
        model: RankModel,
        workload: Workload,
        prompt: torch.Tensor,
        dtype: torch.dtype,
        generate: GenerateFn | None = None,
    ) -> BareCopy:
        """A sharded rank's whole copy where memory is an RSS heap (no device to run out of):
        the built model copied before wrapping shards it, its own KV cache made."""
        rss = memory.peak(prompt.device)[0]
        try:
            module = copy.deepcopy(model.module)
        except Exception:  # noqa: BLE001 - a module that cannot be copied is built again
            return cls.whole(workload, prompt, dtype, generate)
        length = workload.prompt_length + workload.max_new_tokens
        model.setup_caches(workload.batch_size, length, prompt.device, dtype, module=module)
        return cls(module, prompt, workload.max_new_tokens, generate, rss_before_copy=rss)

    def generation(self, tokens: int | None = None) -> Sample | None:
        """One bare generation of `tokens` new tokens (default: the run's), timed; None without a
        model or when it ran out of memory. A copy's allocator peak is read before and reset
        after it: the wrapped run's stays."""
        if self.module is None:
            return None
        if self.copy_bytes:
            peak = torch.cuda.max_memory_allocated(self._device)
            self.wrapped_peaks.append(peak - self.copy_bytes)
        steps = self.steps.override() if self.steps is not None else None
        try:
            sample: Sample | None = timed_generation(
                self.module,
                self.prompt,
                tokens or self.max_new_tokens,
                self._fences,
                generate=self.generate,
                steps=steps,
            )[0]
        except torch.cuda.OutOfMemoryError:
            sample = None
        if sample is None:  # out of memory: drop the copy (and its compiled steps' hold on it)
            self.module, self.steps, self.copy_bytes = None, None, 0
            torch.cuda.empty_cache()
        elif self.copy_bytes:
            torch.cuda.reset_peak_memory_stats(self._device)
        return sample

    def reported_peak(self, peak: int, kind: str) -> tuple[int, str]:
        """The rank's (peak bytes, what they are) with the copy's memory left out."""
        if self.wrapped_peaks:
            # With the copy dropped mid-run, the plain peak since then may still hold part of
            # the bare run that failed: a slight overestimate in a rare case.
            peak = (
                max(self.wrapped_peaks)
                if self.module is not None
                else max(peak, *self.wrapped_peaks)
            )
        if self.rss_before_copy is not None:
            return self.rss_before_copy, f"{kind} (before the bare copy was built)"
        return peak, kind


def _whole_copy(workload: Workload, device: torch.device, dtype: torch.dtype) -> tuple[Any, int]:
    """A whole, unwrapped model with its own KV cache, built from the seed, and its allocator
    bytes (0 for an RSS peak, read before it instead); (None, 0) when it does not fit, on a GPU
    as much memory again must stay free (what the wrapped run gathers: fsdp-noreshard's all)."""
    exact = platform_of(device.type).allocator_memory
    allocated = torch.cuda.memory_allocated(device) if exact else 0
    try:
        built = build(workload, device, dtype)
        built.setup_caches(
            workload.batch_size,
            workload.prompt_length + workload.max_new_tokens,
            device=device,
            dtype=dtype,
        )
        copy = built.module
    except torch.cuda.OutOfMemoryError:
        copy = None
    if not exact:
        return copy, 0
    copy_bytes = torch.cuda.memory_allocated(device) - allocated
    if copy is not None and torch.cuda.mem_get_info(device)[0] < copy_bytes:
        copy = None
    if copy is None:
        torch.cuda.empty_cache()
        return None, 0
    return copy, copy_bytes
