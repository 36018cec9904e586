"""The threshold where ranks time themselves (CPU ranks, one CUDA device): the re-timing check
against the same step timed again after the repeats (judge/threshold.py, ranks/retime.py), which
judges in place of the modelled prediction, the figures it reports, the busy excuse beside it,
and how many times the ranks re-time. Pure: made-up figures, no ranks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pytest_distperf.judge.checks import CheckStatus, GateSettings
from pytest_distperf.judge.gate import Gate, _waited_for_a_core
from pytest_distperf.judge.threshold import retiming_check
from pytest_distperf.measured import Implementation, RankResult, RunResult, Sample
from pytest_distperf.platform import CPU, CUDA, platform_of
from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.store.store import BaselineStore
from pytest_distperf.topology.host import probe_cpu

TOKENS = 10


def _sample(total_s: float, queued_s: float = 0.0) -> Sample:
    return Sample(total_s=total_s, ttft_s=total_s / 10, decode_s=total_s * 0.9,
                  queued_s=queued_s, off_cpu_s=0.0)  # fmt: skip


def _rank(
    rank: int,
    timed: tuple[Sample, ...],
    retimed: tuple[Sample, ...],
    bare: tuple[Sample, ...] = (),
    retimed_bare: tuple[Sample, ...] = (),
) -> RankResult:
    return RankResult(
        rank=rank,
        samples=timed,
        peak_memory_bytes=0,
        memory_kind="",
        implementation=Implementation("", "", "gloo", ""),
        versions={},
        device_name="cpu",
        tokens=(),
        replicas=1,
        timed_from=0.0,
        retimed_samples=retimed,
        bare_samples=bare,
        retimed_bare_samples=retimed_bare,
        run_queue_wait_per_token_s=(timed[0].queued_s or 0.0) / TOKENS if timed else None,
    )


def _run(timed_s: float, retimed_s: tuple[float, ...], queued_s: float = 0.0,
         retimed_queued_s: float = 0.0) -> RunResult:  # fmt: skip
    """A tp run on 2 CPU ranks: 3 repeats of `timed_s` seconds for 10 tokens each, and the same
    generation re-timed at `retimed_s` (rank 1 10% slower in each)."""
    spec = RunSpec("t::x[tp-2cpu]", "tp", 2, "cpu", Workload(max_new_tokens=TOKENS), 3, 0, 10.0)
    ranks = tuple(
        _rank(
            rank,
            tuple(_sample(timed_s * slower, queued_s) for _ in range(3)),
            tuple(_sample(s * slower, retimed_queued_s) for s in retimed_s),
        )
        for rank, slower in ((0, 1.0), (1, 1.1))
    )
    return RunResult(spec, ranks, 0.0, 0.0)  # type: ignore[call-arg]


def test_the_retimed_rate_is_the_slowest_ranks_median() -> None:
    run = _run(0.1, (0.05, 0.2, 0.1))
    assert run.retimed_tokens_per_sec == pytest.approx(TOKENS / 0.11)  # rank 1's median
    one_rank_short = replace(run, ranks=(run.ranks[0], replace(run.ranks[1], retimed_samples=())))
    assert one_rank_short.retimed_tokens_per_sec is None
    uneven = replace(run.ranks[1], retimed_samples=run.ranks[1].retimed_samples[:2])
    assert replace(run, ranks=(run.ranks[0], uneven)).retimed_tokens_per_sec is None


def test_repeats_as_fast_as_the_retimed_step_pass_and_say_which_check() -> None:
    check = retiming_check(_run(0.11, (0.1,)), 0.7, "LOOPBACK")
    assert check is not None and check.status is CheckStatus.OK
    figures = check.figures
    assert figures.check == "re-timing" and figures.bound == "retimed"  # type: ignore[union-attr]
    assert figures.ratio_to_predicted == pytest.approx(0.1 / 0.11)  # type: ignore[union-attr]
    assert figures.threshold_tokens_per_sec == pytest.approx(0.7 * TOKENS / 0.11)  # type: ignore[union-attr]
    assert check.message.startswith("re-timing check: the timed repeats ran at 91% of the same")


def test_repeats_slower_than_the_retimed_step_fail_naming_the_ratio_and_the_knobs() -> None:
    check = retiming_check(_run(0.2, (0.1, 0.1)), 0.7)
    assert check is not None and check.status is CheckStatus.FAIL
    assert "tp on 2 device(s), re-timing check: the timed repeats ran at 50% of" in check.message
    assert "(slowdown, comm_delay)" in check.message and "below 70%" in check.message


def _paired(timed: tuple[float, float], retimed: tuple[float, float]) -> RunResult:
    """2 ranks; (wrapped, bare) seconds of each repeat, and of each re-timing."""
    spec = RunSpec("t::x[tp-2cpu]", "tp", 2, "cpu", Workload(max_new_tokens=TOKENS), 3, 0, 10.0)
    ranks = tuple(
        _rank(
            rank,
            (_sample(timed[0]),) * 3,
            (_sample(retimed[0]),) * 2,
            (_sample(timed[1]),) * 3,
            (_sample(retimed[1]),) * 2,
        )
        for rank in (0, 1)
    )
    return RunResult(spec, ranks, 0.0, 0.0)  # type: ignore[call-arg]


def test_a_host_that_sped_up_after_the_repeats_is_not_read_as_slowed_repeats() -> None:
    # the host ran everything twice as fast when re-timing: the bare model beside says so
    check = retiming_check(_paired((0.2, 0.1), (0.1, 0.05)), 0.7)
    assert check is not None and check.status is CheckStatus.OK
    assert check.figures.ratio_to_predicted == pytest.approx(1.0)  # type: ignore[union-attr]
    assert "ran at 50% of the same step timed again just after them (50 vs 100 tok/s)" in (
        check.message
    )
    assert "at 100% of it against the bare model beside each (0.5 x bare in the repeats" in (
        check.message
    )


def test_a_bare_model_slowed_by_noise_alone_does_not_fail_healthy_repeats() -> None:
    check = retiming_check(_paired((0.1, 0.1), (0.1, 0.2)), 0.7)  # 1.0 x bare, then 2.0 x
    assert check is not None and check.status is CheckStatus.OK
    assert check.figures.ratio_to_predicted == pytest.approx(1.0)  # type: ignore[union-attr]


def test_repeats_slowed_beside_an_unslowed_bare_model_fail() -> None:
    check = retiming_check(_paired((0.2, 0.1), (0.1, 0.1)), 0.7)  # 0.5 x bare, then 1.0 x
    assert check is not None and check.status is CheckStatus.FAIL
    assert check.figures.ratio_to_predicted == pytest.approx(0.5)  # type: ignore[union-attr]
    assert "beside each (0.5 x bare in the repeats, 1 x bare re-timed), both below 70%" in (
        check.message
    )


def test_without_a_retimed_step_the_model_judges(tmp_path: Path) -> None:
    assert retiming_check(_run(0.1, ()), 0.7) is None
    gate = Gate(probe_cpu(2), BaselineStore(tmp_path))
    settings = GateSettings(efficiency=0.7, tolerance=None)
    threshold = gate.decide(_run(0.1, ()), settings, None, "no shape").threshold
    # CPU ranks that did not re-time: nothing judged, never the model in its place
    assert threshold.status is CheckStatus.NOTE
    assert threshold.message == "re-timing check not run: no rank re-timed its step"
    # the re-timing judges with or without a model, and the model's figures stay beside it
    retimed = gate.decide(_run(0.1, (0.1,)), settings, None).threshold
    assert retimed.figures.check == "re-timing"  # type: ignore[union-attr]
    # several GPUs time no step again: the modelled check judges (here with no prediction)
    gpus = _run(0.1, ())
    gpus = replace(gpus, spec=replace(gpus.spec, accelerator="cuda"))
    modelled = gate.decide(gpus, settings, None, "no shape").threshold
    assert modelled.message == "no prediction for this run: no shape"


def test_a_busy_neighbour_is_excused_only_beyond_the_retimed_steps_own_wait(
    tmp_path: Path,
) -> None:
    gate = Gate(probe_cpu(2), BaselineStore(tmp_path))
    settings = GateSettings(efficiency=0.7, tolerance=None)
    # 0.2 s against a re-timed 0.1 s fails; without its 0.12 s wait for a core it ran at 0.08 s
    busy = gate.decide(_run(0.2, (0.1,), queued_s=0.12), settings, None).threshold
    assert busy.status is CheckStatus.WARN and "machine busy" in busy.message
    # the re-timed step waited as long for a core: the repeats' wait is the run's own
    own = gate.decide(_run(0.2, (0.1,), 0.12, 0.12), settings, None).threshold
    assert own.status is CheckStatus.FAIL
    # a rank that chose to wait (off the CPU) has no run-queue evidence: no excuse
    waited = gate.decide(_run(0.2, (0.1,)), settings, None).threshold
    assert waited.status is CheckStatus.FAIL


def test_the_wait_for_a_core_is_the_timing_threads_where_the_process_figure_says_less() -> None:
    run = _run(0.1, (0.1,), queued_s=0.06)  # 6 ms per token both ways
    assert _waited_for_a_core(run) == pytest.approx(0.006)
    queued = replace(run.ranks[0].samples[0], queued_s=0.1)
    ranks = tuple(replace(r, samples=(queued,) * 3) for r in run.ranks)
    assert _waited_for_a_core(replace(run, ranks=ranks)) == pytest.approx(0.01)
    unknown = replace(run.ranks[0].samples[0], queued_s=None)
    ranks = tuple(replace(r, samples=(unknown,) * 3) for r in run.ranks)
    assert _waited_for_a_core(replace(run, ranks=ranks)) == pytest.approx(0.006)


# --------------------------------------------------------------------------- where and how long


def test_ranks_retime_themselves_on_cpu_ranks_and_one_gpu_only() -> None:
    assert [CPU.ranks_time_themselves(n) for n in (1, 2, 4)] == [False, True, True]
    assert [CUDA.ranks_time_themselves(n) for n in (1, 2, 8)] == [True, False, False]


@pytest.mark.parametrize(
    ("first_s", "device", "count"),
    [(0.05, "cpu", 5), (0.25, "cpu", 2), (5.0, "cpu", 1), (0.3, "cuda", 3), (1.5, "cuda", 1)],
)
def test_the_first_timing_counts_and_the_budget_sets_how_many_more(
    first_s: float, device: str, count: int
) -> None:
    from pytest_distperf.ranks.retime import retimed

    calls: list[float] = []

    def once() -> Sample:
        calls.append(first_s)
        return _sample(first_s)

    samples, bare = retimed(once, platform_of(device).retime_budget_s)
    assert len(samples) == len(calls) == count and bare == ()


def test_the_bare_model_runs_beside_each_retiming_and_counts_in_the_budget() -> None:
    from pytest_distperf.ranks.retime import retimed

    order: list[str] = []

    def once() -> Sample:
        order.append("wrapped")
        return _sample(0.1)

    def beside() -> Sample:
        order.append("bare")
        return _sample(0.15)

    samples, bare = retimed(once, CPU.retime_budget_s, beside)  # 0.25 s a pair in 0.6 s: 2
    assert order == ["wrapped", "bare"] * 2 and len(samples) == len(bare) == 2
    dropped = iter([_sample(0.01), *[None] * 4])  # the copy ran out of memory after the first
    samples, bare = retimed(lambda: _sample(0.01), CPU.retime_budget_s, lambda: next(dropped))
    assert len(samples) == 5 and bare == ()  # no pairs to speak of


def test_comm_delays_are_paused_while_retiming() -> None:
    from distperf_model import parallelize

    from pytest_distperf.ranks.retime import retimed

    seen: list[bool] = []

    def once() -> Sample:
        seen.append(parallelize._delays["on"])
        return _sample(1.0)

    retimed(once, CPU.retime_budget_s)
    assert seen == [False] and parallelize._delays["on"]


def test_a_compiled_run_retimes_its_compiled_steps_with_the_bare_copy_beside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """phases.retime runs what the timed repeats ran: the compiled steps' override, the
    strategy's sampling, the repeats' fences, and the bare copy after each."""
    from types import SimpleNamespace

    from pytest_distperf.ranks import phases

    seen: list[dict[str, object]] = []

    def timed(model: object, prompt: object, tokens: int, fences: object, **kw: object) -> tuple:
        seen.append({"model": model, "tokens": tokens, "fences": fences, **kw})
        return _sample(0.01), None

    monkeypatch.setattr(phases, "timed_generation", timed)
    steps, bare_runs = object(), []
    ctx = SimpleNamespace(
        spec=SimpleNamespace(devices=2, retime=True),
        device=torch.device("cpu"),
        platform=CPU,
        wrapped="wrapped",
        prompt="prompt",
        workload=SimpleNamespace(max_new_tokens=6),
        fences="fences",
        generate=None,
        half=SimpleNamespace(next_token="sampler"),
        wrapped_steps=SimpleNamespace(override=lambda: steps),
        bare=SimpleNamespace(generation=lambda: bare_runs.append(1) or _sample(0.01)),
        bare_samples=[_sample(0.01)],
    )
    phases.retime(ctx)  # type: ignore[arg-type]
    assert len(ctx.retimed) == len(ctx.retimed_bare) == len(seen) == len(bare_runs) == 5
    assert {(s["model"], s["steps"], s["next_token"], s["fences"]) for s in seen} == {
        ("wrapped", steps, "sampler", "fences")
    }
    ctx.spec.retime = False  # the gates off
    ctx.retimed = ()
    phases.retime(ctx)  # type: ignore[arg-type]
    assert ctx.retimed == ()
