"""What one test knows inside one rank, filled in phase by phase (ranks/phases.py), dropped
with everything the test built."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from pytest_distperf.measured import RankResult, Sample
    from pytest_distperf.perfmodel.calibration import Calibration
    from pytest_distperf.platform import Platform
    from pytest_distperf.ranks.bare import BareCopy
    from pytest_distperf.ranks.compiled import CompiledStep
    from pytest_distperf.ranks.counting import Counted, DynamoMark
    from pytest_distperf.ranks.models import RankModel
    from pytest_distperf.ranks.reference import ReferenceChoice
    from pytest_distperf.ranks.strategies import BuildContext, RankStrategy
    from pytest_distperf.ranks.timing import Fences, GenerateFn, HostTime
    from pytest_distperf.spec import RunSpec, Workload
    from pytest_distperf.strategies import StrategyRecord

# The dtype weights are stored in; bf16-mixed keeps float32 weights under bfloat16 autocast.
DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "bf16-mixed": torch.float32,
}


@dataclass
class RankContext:
    """One test in one rank; each field below `half` is set by the phase named beside it."""

    spec: RunSpec
    progress: Callable[[str], None] | None  # the live line (rank 0 of a pool only)
    device: torch.device
    platform: Platform  # the device kind's policy (pytest_distperf/platform.py)
    dtype: torch.dtype
    record: StrategyRecord  # the strategy's pure half: checks, sharded, replicas
    half: RankStrategy  # its rank half (ranks/strategies): build, wrap, next_token
    calibration: Calibration | None = None  # calibrate
    model: RankModel | None = None  # build
    generate: GenerateFn | None = None  # build: the test's own generation loop
    prompt: torch.Tensor | None = None  # build: [B, T]
    build_context: BuildContext | None = None  # launch
    fabric: Any = None  # launch
    before_wrap: tuple[float, float | None] | None = None  # reference: (step s, prefill s)
    in_step_s: float | None = None  # reference: one collective between host-run layers
    wrapped: Any = None  # wrap
    fences: Fences | None = None  # wrap
    bare_beside: bool = False  # reference: the bare model runs beside every repeat
    copies_whole: bool = False  # reference: a sharded model's copy taken before wrapping
    bare: BareCopy | None = None  # bare_copy (copy_whole: copied before wrapping)
    wrapped_steps: CompiledStep | None = None  # compile
    compile_s: float | None = None  # compile
    dynamo_before: DynamoMark | None = None  # compile: dynamo's totals before compiling
    samples: list[Sample] = field(default_factory=list)  # time
    loop_s: dict[str, float] = field(default_factory=dict)  # time: warmup, timed, bare seconds
    tokens: torch.Tensor | None = None  # time: the last generation's [B, max_new_tokens]
    timed_from: float = 0.0  # time: epoch seconds when the timed generations began
    bare_samples: list[Sample] = field(default_factory=list)  # time: one beside each sample
    host_loop_s: tuple[float, ...] = ()  # time: the host's loop beside each sample
    host_loop_cpu_s: tuple[float, ...] = ()  # time: its CPU time (the core's own speed)
    host_cpu_per_token_s: float | None = None  # time: CPU seconds per new token, timed repeats
    run_queue_wait_per_token_s: float | None = None  # time: seconds waited for a core, per token
    steal_per_token_s: float | None = None  # time: the hypervisor's steal per CPU, per token
    after_samples: list[Sample] = field(default_factory=list)  # reference_after
    after_tokens: int | None = None  # new tokens of each of them
    reference: ReferenceChoice | None = None  # pick_reference
    peak_floor: int = 0  # calibrate_model: the peak before its buffers, which are not the test's
    peak_memory: tuple[int, str] = (0, "")  # memory: (bytes, what they are)
    counted: Counted | None = None  # count_work: None when off or failed
    count_s: float | None = None  # count_work: seconds it took
    train: TrainState | None = None  # training's calibrate: batch, optimizer, loss, matmul rate
    result: RankResult | None = None  # result

    @property
    def workload(self) -> Workload:
        return self.spec.workload

    def note_host(self, loops: Sequence[tuple[float, float]], host: HostTime, tokens: int) -> None:
        """The host's loop (wall, CPU) beside each repeat; its CPU, wait and steal per token."""
        self.host_loop_s = tuple(wall for wall, _ in loops)
        self.host_loop_cpu_s = tuple(cpu for _, cpu in loops)
        if tokens:
            per = host.per(tokens)
            self.host_cpu_per_token_s, self.run_queue_wait_per_token_s, self.steal_per_token_s = per

    @property
    def compiled_loop(self) -> bool:
        """The timed loop runs compiled steps (not an eager run, nor one left eager)."""
        steps = self.wrapped_steps
        return steps is not None and steps.override() is not None


@dataclass
class TrainState:
    """What the training phases add to a test's RankContext."""

    inputs: torch.Tensor  # [B, T] token ids of this data-parallel rank's batch
    targets: torch.Tensor  # [B, T] the next token of each
    optimizer: Any = None  # wrap: the wrapped model's AdamW, set up by Fabric
    reference_step_s: float | None = None  # reference: the whole model's step, alone
    reference_loss: float | None = None  # reference: its first step's loss
    loss: float | None = None  # time: the first step's loss
    matmul_flops_per_s: float | None = None  # calibrate
    matmul_source: str = ""  # calibrate


Phase = Callable[[RankContext], None]
