from __future__ import annotations

import pytest

from pytest_distperf.spec import Implementation, RankResult, RunResult, RunSpec, Sample, Workload


def _rank(
    rank: int, totals: list[float], bare: list[float], host: tuple[float, ...] = ()
) -> RankResult:
    return RankResult(
        rank=rank,
        samples=tuple(Sample(t, 0.01, t - 0.01) for t in totals),
        peak_memory_bytes=0,
        memory_kind="cuda allocator peak",
        implementation=Implementation("FSDPStrategy", "FSDP1 FULL_SHARD", "nccl", "FSDP"),
        versions={},
        device_name="gpu",
        tokens=((1,),),
        replicas=2,
        timed_from=0.0,
        bare_samples=tuple(Sample(t, 0.01, t - 0.01) for t in bare),
        host_loop_s=host,
    )


def _result(*ranks: RankResult) -> RunResult:
    spec = RunSpec("t", "fsdp", len(ranks), "cuda", Workload(), repeats=2, warmup=0, timeout=9.0)
    return RunResult(spec=spec, ranks=ranks, launch_s=1.0, launched_at=0.0)


def test_relative_speed_pairs_each_repeat_with_the_bare_run_beside_it() -> None:
    # Repeat 2 ran on a host twice as slow: the wrapped and the bare runs both took twice as long.
    result = _result(_rank(0, [1.0, 2.0], [0.30, 0.60]), _rank(1, [1.1, 2.0], [0.33, 0.50]))
    # Slowest rank per repeat on each side: 0.33 / 1.1 and 0.60 / 2.0.
    assert result.relative_speed_samples == pytest.approx((0.3, 0.3))
    assert result.relative_speed == pytest.approx(0.3)
    assert result.summary()["relative_speed_samples"] == pytest.approx([0.3, 0.3])


def test_no_relative_speed_when_a_rank_had_no_bare_model() -> None:
    result = _result(_rank(0, [1.0, 2.0], [0.3, 0.6]), _rank(1, [1.0, 2.0], []))
    assert result.relative_speed_samples == ()
    assert result.relative_speed is None


def test_host_loop_per_repeat_is_the_slowest_ranks() -> None:
    result = _result(
        _rank(0, [1.0, 2.0], [], (0.013, 0.025)), _rank(1, [1.0, 2.0], [], (0.014, 0.022))
    )
    assert result.host_loop_samples == (0.014, 0.025)
    assert result.summary()["host_loop_samples"] == [0.014, 0.025]
    assert (
        _result(
            _rank(0, [1.0, 2.0], [], (0.013, 0.025)), _rank(1, [1.0, 2.0], [])
        ).host_loop_samples
        == ()
    )


def test_result_line_shows_the_relative_speed_change_and_what_it_can_detect() -> None:
    from pytest_distperf.output.report import RESULT_HEADER, format_result_line

    props = {
        "distperf_tokens_per_sec": 16.99,
        "distperf_devices": 2,
        "distperf_accelerator": "cuda",
        "distperf_strategy": "fsdp",
        "distperf_change": -0.335,
        "distperf_detectable_drop": 0.208,
        "distperf_relative_speed_change": 0.038,
        "distperf_relative_speed_detectable_drop": 0.135,
        "distperf_verdict": "FAIL (baseline)",
    }
    line = format_result_line("t.py::test[fsdp-2cuda]", "passed", props)
    assert "-33.5%    21%   +3.8%    14%  FAIL (baseline)" in line
    assert "rel.chg detect  verdict" in RESULT_HEADER
    assert "      -      -  ok" in format_result_line("t", "passed", {**props, **_no_relative()})


def _no_relative() -> dict:
    return {
        "distperf_relative_speed_change": None,
        "distperf_relative_speed_detectable_drop": None,
        "distperf_verdict": "ok",
    }
