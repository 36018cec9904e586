"""`distperf plot`: charts of a report and of a baseline directory's history (output/charts.py)."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers import shared_cache, use_shared_pool

from pytest_distperf.cli import main
from pytest_distperf.judge.tolerance import SAFETY
from pytest_distperf.output import charts
from pytest_distperf.output.charts import (
    ChartError,
    plot_history,
    plot_report,
    report_bars,
    store_histories,
)
from pytest_distperf.store.entry import BaselineEntry
from pytest_distperf.store.store import BaselineStore

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
KEY = "cpu_x2_loopbackx1_2cpus"


def _row(test_id: str, strategy: str, devices: int, rate: float | None, **more: object) -> dict:
    return {
        "test_id": test_id,
        "strategy": strategy,
        "devices": devices,
        "tokens_per_sec": rate,
        "topology_key": KEY,
        **more,
    }


REPORT = {
    "schema": 1,
    "results": [
        _row(
            "t.py::test_gen[auto-2cpu]",
            "auto",
            2,
            33.6,
            predicted_tokens_per_sec=38.4,
            threshold_tokens_per_sec=26.9,
            bound="compute",
            verdict="ok",
        ),
        _row(
            "t.py::test_gen[fsdp-2cpu]",
            "fsdp",
            2,
            1.26,
            predicted_tokens_per_sec=0.95,
            threshold_tokens_per_sec=0.67,
            bound="all_gather",
            verdict="FAIL (baseline)",
        ),
        _row("t.py::test_gen[auto-1cpu]", "auto", 1, 20.0, verdict="ok"),
        _row("t.py::test_other[auto-2cpu]", "auto", 2, 50.0),
        _row("t.py::test_broken[auto-2cpu]", "auto", 2, None),  # measured nothing: no bar
    ],
}


def _png(path: Path) -> bytes:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path} is only {len(data)} bytes"
    return data


def test_report_bars() -> None:
    bars = report_bars(REPORT)
    assert [(b.test_id, b.strategy, b.devices) for b in bars] == [
        ("t.py::test_gen[auto-2cpu]", "auto", 2),
        ("t.py::test_gen[fsdp-2cpu]", "fsdp", 2),
        ("t.py::test_gen[auto-1cpu]", "auto", 1),
        ("t.py::test_other[auto-2cpu]", "auto", 2),
    ]
    fsdp = bars[1]
    figures = (fsdp.predicted_tokens_per_sec, fsdp.threshold_tokens_per_sec, fsdp.bound)
    assert figures == (0.95, 0.67, "all_gather")
    assert [charts._failed(b) for b in bars] == [False, True, False, False]
    assert {charts._test(b) for b in bars} == {"t.py::test_gen", "t.py::test_other"}
    assert bars[2].predicted_tokens_per_sec is None


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"results": [{"strategy": "auto"}]}, r"results\[0\]: missing field 'test_id'"),
        (
            {"results": [_row("t", "auto", 2, 5.0, predicted_tokens_per_sec="fast")]},
            r"results\[0\]: field 'predicted_tokens_per_sec' must be a number, got 'fast'",
        ),
        ({"schema": 9, "results": []}, "unknown report schema 9"),
    ],
)
def test_a_malformed_report_is_refused_with_the_reason(document: object, message: str) -> None:
    with pytest.raises(ChartError, match=message):
        report_bars(document)


def _record(directory: Path, medians: list[float]) -> BaselineStore:
    """One test refreshed once per median, five repeats around each."""
    store = BaselineStore(directory)
    test_id = "t.py::test_gen[auto-2cpu] [model=tiny]"
    for run, median in enumerate(medians):
        samples = [median * f for f in (0.98, 0.99, 1.0, 1.01, 1.02)]
        now = datetime(2026, 12, 1, run, tzinfo=timezone.utc)
        entry = BaselineEntry.from_samples(test_id, samples, None, {}, now=now)
        previous = store.load(KEY).get(test_id)
        entry = entry.following(previous) if previous else entry
        store.save(KEY, {test_id: entry}, {})
    return store


def test_store_histories_hold_the_gates_level_and_tolerance(tmp_path: Path) -> None:
    store = _record(tmp_path, [100.0, 90.0, 110.0, 104.0])
    [history] = store_histories(tmp_path)
    entry = store.load(KEY).get(history.test_id)
    assert history.run_medians == (100.0, 90.0, 110.0, 104.0)
    assert history.latest_samples == entry.samples
    # the gate's level and tolerance: the runs' median, 3 x the largest drop below it (90)
    assert history.level == 102.0 and history.tolerance_runs == 4
    assert history.tolerance == pytest.approx(SAFETY * (1 - 90.0 / 102.0))
    assert entry.run_medians == history.run_medians


def test_a_directory_without_baselines_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ChartError, match="no such baseline directory"):
        store_histories(tmp_path / "missing")
    with pytest.raises(ChartError, match="no baselines recorded there"):
        store_histories(tmp_path)


def test_both_charts_are_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _png(plot_report(report_bars(REPORT), tmp_path / "out" / "report.png"))
    _record(tmp_path / "baselines", [100.0, 90.0, 110.0])
    histories = store_histories(tmp_path / "baselines")
    _png(plot_history(histories * 3, tmp_path / "history.png"))  # a grid of panels


def test_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    report = tmp_path / "report.json"
    report.write_text(json.dumps(REPORT))
    assert main(["plot", str(report), "-o", str(tmp_path / "r.png")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'r.png'}\n"
    _record(tmp_path / "baselines", [100.0])
    history = ["plot", "--history", str(tmp_path / "baselines"), "-o", str(tmp_path / "h.png")]
    assert main(history) == 0
    _png(tmp_path / "h.png")
    assert main(["plot", "-o", str(tmp_path / "x.png")]) == 2
    assert "give either a REPORT or --history BASELINE_DIR" in capsys.readouterr().err
    report.write_text("{")
    assert main(["plot", str(report), "-o", str(tmp_path / "x.png")]) == 2
    assert f"cannot read report {report}" in capsys.readouterr().err


def test_without_matplotlib_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import of it fails
    report = tmp_path / "report.json"
    report.write_text(json.dumps(REPORT))
    assert main(["plot", str(report), "-o", str(tmp_path / "r.png")]) == 2
    assert capsys.readouterr().err == (
        "distperf plot: error: matplotlib is not installed: pip install 'pytest-distperf[plot]'\n"
    )
    assert not (tmp_path / "r.png").exists()


# --- from real runs -----------------------------------------------------------------------------

SUITE = """
import pytest

# Charts of the figures, not a test of the gates: they are off.
@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=6, gates=False)
def test_throughput(distperf):
    distperf.run()
"""


@pytest.mark.slow
def test_charts_of_real_runs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, shared_pool: str
) -> None:
    pytest.importorskip("matplotlib")
    pytester.makepyfile(SUITE)
    baselines = pytester.path / "baselines"
    args = (
        "--distperf-devices=2",
        "--distperf-accelerator=cpu",
        "--distperf-repeats=3",
        "--distperf-count=off",  # charts of timing figures
        f"--distperf-baseline-dir={baselines}",
        "--distperf-update-baselines",
    )
    pool = use_shared_pool(monkeypatch, shared_pool)
    for run in (1, 2):
        result = pytester.runpytest_subprocess(
            *shared_cache(), *pool, *args, f"--distperf-json=report{run}.json"
        )
        result.assert_outcomes(passed=2)
    assert main(["plot", "report2.json", "-o", "charts/results.png"]) == 0
    assert main(["plot", "--history", str(baselines), "-o", "charts/history.png"]) == 0
    _png(pytester.path / "charts" / "results.png")
    _png(pytester.path / "charts" / "history.png")
    histories = store_histories(baselines)
    assert sorted(h.test_id.split(" [")[0] for h in histories) == [
        "test_charts_of_real_runs.py::test_throughput[auto-2cpu]",
        "test_charts_of_real_runs.py::test_throughput[fsdp-2cpu]",
    ]
    assert all(len(h.run_medians) == 2 for h in histories)
    report = json.loads((pytester.path / "report2.json").read_text())
    assert {bar.strategy for bar in report_bars(report)} == {"auto", "fsdp"}
