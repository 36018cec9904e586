"""The ranks' own waits: measured per timed generation on the timing thread, and a rise of
them fails a slower run whatever the throughput's tolerance (judge/waits.py)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from pytest_distperf.judge.checks import (
    BaselineFigures,
    BusyEvidence,
    CheckStatus,
    GateSettings,
    baseline_check,
)
from pytest_distperf.judge.waits import wait_tolerance, waits_check
from pytest_distperf.measured import Sample, off_cpu_shares
from pytest_distperf.store.entry import BaselineEntry

SETTINGS = GateSettings(efficiency=0.7, tolerance=None)
BASE = [100.0, 101.0, 99.0, 100.5, 99.5]
NOTHING_OUTSIDE = BusyEvidence(0.0, 0.0, 1.0)


def _entry(
    shares: tuple[float, ...] = (0.01,), repeats: tuple[float, ...] = (0.01, 0.012, 0.0)
) -> BaselineEntry:
    entry = BaselineEntry.from_samples("t::x[auto-2cpu]", BASE, 1, {}, off_cpu_shares=repeats)
    return replace(entry, off_cpu_share_run_medians=shares)


def _throughput(entry: BaselineEntry, slower_by: float):
    return baseline_check(entry, [v * (1 - slower_by) for v in BASE], SETTINGS, "k", [])


def test_a_wait_fails_a_run_the_throughput_tolerance_let_pass() -> None:
    # Three recorded runs far apart: the throughput's tolerance is wide, the waits' is not.
    entry = replace(_entry((0.01, 0.012, 0.011)), run_medians=(70.0, 100.0, 130.0))
    throughput = _throughput(entry, 0.2)
    assert throughput.status is CheckStatus.OK
    judged = waits_check(throughput, entry, [0.21, 0.2, 0.22], NOTHING_OUTSIDE, SETTINGS)
    assert judged.status is CheckStatus.FAIL
    figures = judged.figures
    assert isinstance(figures, BaselineFigures) and figures.verdict == "regression"
    assert figures.waits is not None and figures.waits.rise == pytest.approx(0.21 - 0.011)
    assert judged.message.startswith(
        "the ranks waited 21.0% of each generation's wall time off the CPU by their own doing, "
        "1.1% when recorded: +19.9% of the wall time (tolerance 5.0%) while tok/s changed -20.0%"
    )
    assert "a sleep, a host-device sync, I/O, a lock, a peer in a collective" in judged.message


def test_waits_within_tolerance_pass_and_a_faster_host_hides_no_wait() -> None:
    entry = _entry()
    steady = waits_check(_throughput(entry, 0.02), entry, [0.04], NOTHING_OUTSIDE, SETTINGS)
    assert steady.status is CheckStatus.OK and steady.figures.waits.rise == pytest.approx(0.03)
    # the host ran faster than when recorded: tok/s rose, the rank still waited a fifth more
    faster = waits_check(_throughput(entry, -0.05), entry, [0.21], NOTHING_OUTSIDE, SETTINGS)
    assert faster.status is CheckStatus.FAIL and "tok/s changed +5.0%" in faster.message


def test_a_busy_machine_excuses_no_wait_but_its_own_measured_share() -> None:
    entry = _entry()
    throughput = _throughput(entry, 0.5)  # 20 ms per token now, 10 when recorded
    assert throughput.status is CheckStatus.FAIL
    # a peer waited 8 ms per token for a core: the rank's wait on it is the machine's
    peer_queued = BusyEvidence(0.008, 0.0, 1.0)
    excused = waits_check(throughput, entry, [0.41], peer_queued, SETTINGS)
    assert excused.figures.waits.outside_share == pytest.approx(0.4)
    assert excused == replace(throughput, figures=excused.figures)  # the verdict stays its own
    # a 'machine busy' warning does not survive a wait the evidence leaves unexplained
    warned = replace(throughput, status=CheckStatus.WARN)
    assert waits_check(warned, entry, [0.41], NOTHING_OUTSIDE, SETTINGS).status is (
        CheckStatus.FAIL
    )


def test_without_both_sides_measured_nothing_changes() -> None:
    entry = _entry()
    throughput = _throughput(entry, 0.5)
    assert waits_check(throughput, entry, [], NOTHING_OUTSIDE, SETTINGS) == throughput
    old = _entry(())
    assert waits_check(throughput, old, [0.5], NOTHING_OUTSIDE, SETTINGS) == throughput
    assert waits_check(throughput, None, [0.5], NOTHING_OUTSIDE, SETTINGS) == throughput


def test_the_baselines_noise_sets_the_tolerance_never_this_runs() -> None:
    noisy = _entry((0.3,), (0.2, 0.25, 0.3, 0.35, 0.4))
    throughput = _throughput(noisy, 0.1)
    # repeats at 0.35-0.6 against a baseline whose own repeats spread 0.2-0.4: within its noise
    assert waits_check(throughput, noisy, [0.35, 0.6, 0.4], NOTHING_OUTSIDE, SETTINGS).status is (
        CheckStatus.OK
    )
    steady = _entry((0.01,))
    uneven_now = [0.0, 0.4, 0.1, 0.5, 0.2]  # a regression that waits unevenly
    assert waits_check(throughput, steady, uneven_now, NOTHING_OUTSIDE, SETTINGS).status is (
        CheckStatus.FAIL
    )
    with pytest.raises(ValueError, match=r"off_cpu_share_samples must be in \[0, 1\], got 1.5"):
        BaselineEntry.from_samples("t::x", BASE, 1, {}, off_cpu_shares=[0.2, 1.5])
    assert BaselineEntry.from_dict(steady.to_dict()) == steady
    assert steady.off_cpu_share_samples == (0.01, 0.012, 0.0)  # no wait at all is a value


def test_the_tolerance_is_the_floor_until_repeats_or_recorded_runs_show_a_spread() -> None:
    steady = [0.30, 0.31, 0.30, 0.29, 0.30]
    assert wait_tolerance((0.3,), steady, SETTINGS) == SETTINGS.wait_share_floor
    assert wait_tolerance((0.3, 0.5), steady, SETTINGS) == SETTINGS.wait_share_floor
    # three recorded runs 0.1 apart: 0.1 x the 3-run prediction factor (8.0)
    assert wait_tolerance((0.20, 0.30, 0.40), steady, SETTINGS) == pytest.approx(0.8, rel=0.01)
    # repeats that wait 0.2-0.4 of their time: 3 sigmas of their interquartile spread
    uneven = [0.2, 0.25, 0.3, 0.35, 0.4]
    assert wait_tolerance((0.3,), uneven, SETTINGS) == pytest.approx(3 * 0.15 / 1.349)
    assert wait_tolerance((0.3,), [0.2, 0.4], SETTINGS) == SETTINGS.wait_share_floor


def test_the_rank_that_waited_most_sets_each_repeats_share() -> None:
    rank0 = (Sample(1.0, None, None, 0.1, 0.2), Sample(1.0, None, None, 0.0, 0.5))
    rank1 = (Sample(2.0, None, None, 0.0, 0.2), Sample(1.0, None, None, 0.0, 0.1))
    assert off_cpu_shares([rank0, rank1]) == pytest.approx((0.2, 0.5))
    unknown = (Sample(1.0, None, None), Sample(1.0, None, None))
    assert off_cpu_shares([rank0, unknown]) == ()


@pytest.mark.skipif(
    not __import__("os").path.exists("/proc/thread-self/schedstat"), reason="no schedstat here"
)
def test_a_sleep_is_counted_off_the_cpu_and_a_spin_is_not() -> None:
    from pytest_distperf.ranks.hostspeed import thread_times
    from pytest_distperf.ranks.timing import thread_accounting

    def accounted(work) -> dict[str, float]:
        start, started = time.perf_counter(), thread_times()
        work()
        return thread_accounting(started, time.perf_counter() - start)

    slept = accounted(lambda: time.sleep(0.05))
    assert slept["off_cpu_s"] >= 0.045
    until = time.perf_counter() + 0.05

    def spin() -> None:
        while time.perf_counter() < until:
            pass

    spun = accounted(spin)
    assert spun["off_cpu_s"] < 0.02 and spun["queued_s"] >= 0.0
