"""Runs inside one rank: one test, phase by phase (ranks/phases.py) -> RankResult. The rank
variables are set before, so Fabric sees an externally launched job and never re-runs pytest."""

from __future__ import annotations

import faulthandler
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from pytest_distperf.measured import RankResult
from pytest_distperf.ranks import bare_phases, phases, training
from pytest_distperf.ranks.context import Phase, RankContext
from pytest_distperf.spec import RunSpec

# One test, in order: each phase sets its part of the test's RankContext (ranks/context.py),
# its seconds reported under its key (RankResult.phase_s; "": the timing phase, which splits its
# own into warmup, timed and bare: RankContext.loop_s).
PHASES: tuple[tuple[Phase, str], ...] = (
    (phases.join, "join"),  # the process group
    (phases.calibrate, "calibrate"),  # collectives at the session's sizes, before the model
    (phases.build, "build"),  # the model, from the seed
    (phases.calibrate_model, "calibrate"),  # collectives at a builder's own sizes
    (phases.check, "build"),  # the test's own loop; what only a built model can refuse
    (phases.launch, "build"),  # Fabric with the strategy built for this model
    (phases.prompt, "build"),  # the prompt, the same on every rank
    (phases.reference, "reference"),  # the unwrapped model timed, where that is the reference
    (bare_phases.copy_whole, "bare"),  # a sharded model's bare copy, before wrapping (CPU)
    (phases.wrap, "wrap"),  # the strategy's wrapper; KV caches
    (bare_phases.bare_copy, "bare"),  # the bare model, where it runs beside every generation
    (phases.compile_steps, "compile"),  # distperf(compile=True): compiled before the warm-up
    (phases.time_generations, ""),  # warm-up and timed repeats, the bare model beside each
    (bare_phases.reference_after, "reference"),  # a replicated model's own module, after them
    (phases.pick_reference, "result"),  # the reference the run reports
    (phases.memory_peak, "result"),  # the test's peak memory
    (phases.count_work, "count"),  # one more generation, untimed, its work counted per token
    (phases.result, "result"),  # the RankResult
)

# distperf(mode="train"): optimizer steps in place of generations (ranks/training.py).
TRAIN_PHASES: tuple[tuple[Phase, str], ...] = (
    (phases.join, "join"),  # the process group
    (phases.build, "build"),  # the model, from the seed
    (training.calibrate, "calibrate"),  # collectives at a step's sizes; matmul rate; the batch
    (training.check, "build"),  # what only a built model can refuse
    (phases.launch, "build"),  # Fabric with the strategy built for this model
    (training.reference, "reference"),  # the whole model's step and loss, before wrapping
    (training.wrap, "wrap"),  # the strategy's wrapper; AdamW
    (training.time_steps, ""),  # warm-up and timed steps; the first step's loss
    (training.memory_peak, "result"),  # the steps' peak memory
    (training.count_step, "count"),  # one more step, untimed, its work counted
    (training.result, "result"),  # the RankResult
)
PHASE_ORDER = (
    *("join", "calibrate", "build", "reference", "wrap", "compile"),
    *("warmup", "timed", "bare", "count", "result"),
)


def run_rank(
    spec: RunSpec, progress: Callable[[str], None] | None = None, *, deadline: bool = True
) -> RankResult:
    """Entry point of every rank (module level: it is pickled). `progress`: the live line (rank 0
    of a pool); `deadline`: False where the caller keeps --distperf-timeout (job mode)."""
    with _watchdog(spec.timeout if deadline else None):
        context = phases.start(spec, progress)
        spent = dict.fromkeys(PHASE_ORDER, 0.0)
        for phase, key in TRAIN_PHASES if spec.workload.training else PHASES:
            began = time.perf_counter()
            phase(context)
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - began
    if context.result is None:
        raise RuntimeError("the rank's phases ended without a result")
    loop_s = spent.pop("", 0.0)
    for name, seconds in context.loop_s.items():
        spent[name] += seconds
    spent["warmup"] += max(loop_s - sum(context.loop_s.values()), 0.0)  # setting the loop up
    return _with_model_startup(replace(context.result, phase_s=spent), context)


def _with_model_startup(result: RankResult, context: RankContext) -> RankResult:
    """A transformers model's version among the versions; its import and build, taken out of
    `build`'s seconds, under their own names (`model_import`, `model_build`)."""
    model = context.model
    if model is None or not model.transformers_version:
        return result
    versions = {**result.versions, "transformers": model.transformers_version}
    spent = dict(result.phase_s)
    if model.startup is not None:
        startup = {"model_import": model.startup.import_s, "model_build": model.startup.build_s}
        spent["build"] = max(spent.get("build", 0.0) - sum(startup.values()), 0.0)
        spent = {**spent, **startup}
    return replace(result, versions=versions, phase_s=spent)


@contextmanager
def _watchdog(timeout: float | None) -> Iterator[None]:
    # A hung collective never returns to Python, so the watchdog lives in faulthandler's C
    # thread: at the deadline it writes every thread's stack to stderr and exits the rank.
    if timeout is not None:
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.stderr)
    # When another rank fails or times out, the launcher stops this one with SIGTERM: leave its
    # stack behind too, so a hang shows where every rank was.
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    try:
        yield
    finally:
        if timeout is not None:
            faulthandler.cancel_dump_traceback_later()
        faulthandler.unregister(signal.SIGTERM)
