"""`distperf plot`: a report's tok/s per strategy, or each baseline's recorded medians with the
band the next run is held to, as PNG (matplotlib's Agg canvas without pyplot: no display)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_distperf.output.markdown import ReportError, SummaryRow, parse_report, rate_text

INSTALL_HINT = "pip install 'pytest-distperf[plot]'"
# One colour per rank count (matplotlib's default cycle), the marks in fixed contrasting colours.
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")
_PREDICTED, _THRESHOLD, _FAILED = "#111111", "#d62728", "#d62728"
_DPI = 110
_LABEL = {"xytext": (0, 4), "textcoords": "offset points", "ha": "center", "va": "bottom"}


class ChartError(Exception):
    """A chart that cannot be drawn; the message says why (bad input, no matplotlib)."""


def report_bars(document: object, source: str = "report") -> list[SummaryRow]:
    """The measured runs of a JSON report; ChartError naming the field when it is not one."""
    try:
        rows = parse_report(document, source)
    except ReportError as error:
        raise ChartError(str(error)) from None
    return [r for r in rows if r.tokens_per_sec is not None and math.isfinite(r.tokens_per_sec)]


def _test(bar: SummaryRow) -> str:
    return bar.test_id.split("[", 1)[0]  # the test function: node id without its parameters


def _failed(bar: SummaryRow) -> bool:
    return (bar.verdict or "").upper().startswith("FAIL")


@dataclass(frozen=True)
class History:
    """One test's recorded runs in a baseline store, and what the next run is held to."""

    topology_key: str
    test_id: str
    run_medians: tuple[float, ...]
    latest_samples: tuple[float, ...]
    level: float
    tolerance: float
    tolerance_runs: int  # recorded runs whose spread set the tolerance (0: the repeats did)


def store_histories(directory: str | Path) -> list[History]:
    """Every entry of the baseline store in `directory`, with the gate's default tolerance."""
    from pytest_distperf.judge.tolerance import THROUGHPUT_FLOOR, recorded_level, run_tolerance
    from pytest_distperf.store.snapshot import SnapshotError, read_directory

    try:
        snapshot = read_directory(directory)
    except SnapshotError as error:
        raise ChartError(str(error)) from None
    if snapshot.unreadable:
        raise ChartError(str(snapshot.unreadable[0]))
    histories = []
    for key, entries in snapshot.entries.items():
        for test_id, entry in sorted(entries.items()):
            runs = entry.run_medians or (entry.median,)
            accelerator = "cuda" if key.startswith("cuda") else "cpu"
            held = run_tolerance(runs, THROUGHPUT_FLOOR[accelerator], accelerator)
            from_runs = 0 if held.provisional else held.runs
            level = recorded_level(runs)  # the level and tolerance as the gate holds them
            histories.append(
                History(key, test_id, runs, entry.samples, level, held.fails, from_runs)
            )
    if not histories:
        raise ChartError(f"{directory}: no baselines recorded there")
    return histories


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ChartError(f"matplotlib is not installed: {INSTALL_HINT}") from None
    figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Any, out: str | Path, title: str) -> Path:
    figure.suptitle(title, fontsize=12)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def plot_report(bars: Sequence[SummaryRow], out: str | Path, title: str = "") -> Path:
    """tok/s per strategy, one panel per test function, one bar per rank count."""
    if not bars:
        raise ChartError("the report has no measured runs to draw")
    tests = list(dict.fromkeys(_test(bar) for bar in bars))
    counts = sorted({bar.devices for bar in bars}, key=lambda d: (d is None, d or 0))
    widest = max(len({b.strategy for b in bars if _test(b) == t}) for t in tests)
    figure = _figure(max(6.5, 1.5 + widest * (1.0 + 0.5 * len(counts))), 0.6 + 3.4 * len(tests))
    axes = figure.subplots(len(tests), 1, squeeze=False)[:, 0]
    width = 0.8 / len(counts)
    for ax, test in zip(axes, tests, strict=True):
        mine = [bar for bar in bars if _test(bar) == test]
        strategies = list(dict.fromkeys(bar.strategy for bar in mine))
        for slot, count in enumerate(counts):
            for bar in (b for b in mine if b.devices == count):
                x = strategies.index(bar.strategy) + (slot - (len(counts) - 1) / 2) * width
                _draw_bar(ax, x, width, bar, _COLOURS[slot % len(_COLOURS)])
        ax.set_xticks(range(len(strategies)), [_tick(s, mine) for s in strategies])
        ax.set_xlim(-0.6, len(strategies) - 0.4)
        figures = [b.tokens_per_sec or 0 for b in mine] + [
            b.predicted_tokens_per_sec or 0 for b in mine
        ]
        positive = [f for f in figures if f > 0]
        if max(positive) / min(positive) > 20:  # far-apart rates: each readable on a log axis
            from matplotlib.ticker import FuncFormatter

            ax.set_yscale("log")
            ax.set_ylim(min(positive) / 4, max(positive) * 4)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        else:
            ax.set_ylim(0, max(positive) * 1.3)
        ax.set_ylabel("tokens/sec")
        ax.set_title(test, fontsize=10, loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    _report_legend(figure, counts, bars)
    keys = sorted({bar.topology_key for bar in bars if bar.topology_key})
    where = f" on {keys[0]}" if len(keys) == 1 else ""
    return _save(figure, out, title or f"distperf: tokens/sec per strategy{where}")


def _draw_bar(ax: Any, x: float, width: float, bar: SummaryRow, colour: str) -> None:
    rate, failed = bar.tokens_per_sec or 0.0, _failed(bar)
    predicted, threshold = bar.predicted_tokens_per_sec, bar.threshold_tokens_per_sec
    ax.bar(
        x, rate, width * 0.92, color=colour, edgecolor=_FAILED if failed else "none", linewidth=2
    )
    label = rate_text(rate) + (" FAIL" if failed else "")
    colour = _FAILED if failed else "black"  # above the bar and its marks
    top = max(rate, predicted or 0, threshold or 0)
    ax.annotate(label, (x, top), color=colour, fontsize=9, weight="bold", **_LABEL)
    half = width * 0.46
    if predicted:
        ax.hlines(predicted, x - half, x + half, colors=_PREDICTED, linewidth=2.5)
        ax.plot([x], [predicted], marker="D", color=_PREDICTED, markersize=5)
    if threshold:
        ax.hlines(threshold, x - half, x + half, colors=_THRESHOLD, linestyles="--", linewidth=1.8)


def _tick(strategy: str | None, bars: Sequence[SummaryRow]) -> str:
    bounds = sorted({b.bound for b in bars if b.strategy == strategy and b.bound})
    return (strategy or "?") + (f"\nbound: {', '.join(bounds)}" if bounds else "")


def _report_legend(figure: Any, counts: Sequence[int | None], bars: Sequence[SummaryRow]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [
        Patch(color=_COLOURS[i % len(_COLOURS)], label=_ranks(count))
        for i, count in enumerate(counts)
    ]
    if any(b.predicted_tokens_per_sec for b in bars):
        handles.append(
            Line2D([], [], color=_PREDICTED, marker="D", linewidth=2.5, label="predicted")
        )
    if any(b.threshold_tokens_per_sec for b in bars):
        handles.append(Line2D([], [], color=_THRESHOLD, linestyle="--", label="threshold"))
    if any(_failed(b) for b in bars):
        handles.append(Patch(facecolor="white", edgecolor=_FAILED, linewidth=2, label="failed"))
    figure.legend(handles=handles, fontsize=9, loc="outside lower center", ncols=len(handles))


def plot_history(histories: Sequence[History], out: str | Path, title: str = "") -> Path:
    """Each test's run medians across refreshes, with the band of the gate's tolerance."""
    columns = 1 if len(histories) < 3 else 2
    rows = math.ceil(len(histories) / columns)
    figure = _figure(6.5 * columns, 0.6 + 3.0 * rows)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    keys = sorted({h.topology_key for h in histories})
    for ax, history in zip(axes, histories, strict=False):
        runs = history.run_medians
        xs = list(range(1, len(runs) + 1))
        low, high = history.level * (1 - history.tolerance), history.level * (1 + history.tolerance)
        spread = history.tolerance_runs
        source = f"the spread of {spread} recorded runs" if spread else "the latest repeats"
        ax.axhspan(low, high, color="#2ca02c", alpha=0.15, label="tolerance band (next run)")
        ax.axhline(history.level, color="#2ca02c", linestyle="--", linewidth=1.2, label="level")
        ax.axhline(low, color=_THRESHOLD, linewidth=1, alpha=0.7, label="drop beyond the tolerance")
        level = f"median of {len(runs)} runs" if len(runs) >= 3 else "latest run"
        latest, label = history.latest_samples, "latest repeats"
        ax.scatter([xs[-1]] * len(latest), latest, color="#7f7f7f", s=12, zorder=3, label=label)
        ax.plot(xs, runs, marker="o", color=_COLOURS[0], zorder=4, label="run median")
        ax.set_xticks(xs)
        ax.set_xlim(0.5, len(runs) + 0.5)
        ax.set_ylim(min(low, *runs, *latest) * 0.85, max(high, *runs, *latest) * 1.1)
        ax.set_xlabel("recorded run (oldest first)")
        ax.set_ylabel("tokens/sec")
        name = history.test_id if len(keys) == 1 else f"{history.test_id} ({history.topology_key})"
        ax.set_title(
            f"{_short(name)}\nlevel {rate_text(history.level)} tok/s ({level}), "
            f"tolerance ±{history.tolerance:.0%} from {source}",
            fontsize=9,
            loc="left",
        )
        ax.grid(alpha=0.3)
    for ax in axes[len(histories) :]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: not labels[i].startswith("run median"))
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    figure.legend(handles, labels, fontsize=9, loc="outside lower center", ncols=3)
    where = keys[0] if len(keys) == 1 else f"{len(keys)} topology keys"
    return _save(figure, out, title or f"distperf baseline history: {where}")


def _short(test_id: str, limit: int = 70) -> str:
    """A baseline test id (`path::test[params] [workload]`) without path and workload."""
    name = test_id.rsplit(" [", 1)[0] if test_id.endswith("]") and " [" in test_id else test_id
    name = name.rsplit("::", 1)[-1]
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _ranks(count: int | None) -> str:
    return "ranks unknown" if count is None else f"{count} rank" + ("s" if count != 1 else "")


def add_parser(sub: Any) -> None:
    """The `plot` subcommand of `distperf` (cli.py)."""
    plot = sub.add_parser(
        "plot",
        help="draw a report's tok/s, or a baseline directory's history, as a PNG",
        description="Draw tok/s per strategy of a JSON report (--distperf-json), or the recorded "
        f"runs of a baseline directory with their tolerance. Needs matplotlib: {INSTALL_HINT}.",
    )
    plot.add_argument("report", nargs="?", help="a JSON report written by --distperf-json")
    plot.add_argument("--history", metavar="BASELINE_DIR", help="a baseline directory instead")
    plot.add_argument("-o", "--output", required=True, metavar="PNG", help="the file to write")
    plot.add_argument("--title", default="", help="the chart's title")


def cmd_plot(args: argparse.Namespace) -> int:
    if (args.report is None) == (args.history is None):
        raise ChartError("give either a REPORT or --history BASELINE_DIR")
    if args.history is not None:
        path = plot_history(store_histories(args.history), args.output, args.title)
    else:
        try:
            document = json.loads(Path(args.report).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ChartError(f"cannot read report {args.report}: {error}") from None
        path = plot_report(report_bars(document, args.report), args.output, args.title)
    print(f"wrote {path}")
    return 0
