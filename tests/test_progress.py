"""The live progress line: rank 0's timing loop -> its pipe -> the pool -> the terminal."""

from __future__ import annotations

from multiprocessing import Pipe
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from distperf_model.config import Config
from distperf_model.generate import make_prompt
from distperf_model.model import build_model
from helpers import shared_cache

from pytest_distperf.launch.pool import RankPool
from pytest_distperf.progress import ProgressLine
from pytest_distperf.ranks.serve import DONE, PROGRESS
from pytest_distperf.ranks.timing import Fences, run_workload


def test_timing_loop_reports_warmups_and_repeats_with_the_rate() -> None:
    model = build_model(Config.from_name("tiny"), seed=1)
    model.setup_caches(1, 8 + 4, device=torch.device("cpu"), dtype=torch.float32)
    prompt = make_prompt(model.config, 1, 8, 1, torch.device("cpu"))
    texts: list[str] = []
    fences = Fences(sync=lambda: None, barrier=lambda: None)
    samples, *_ = run_workload(model, prompt, 4, 2, 3, fences, progress=texts.append)
    assert texts[:2] == ["warm-up 1/2", "warm-up 2/2"]
    for k, (text, sample) in enumerate(zip(texts[2:], samples, strict=True), start=1):
        assert text == f"repeat {k}/3: {4 / sample.total_s:.2f} tok/s (rank 0)"


def test_pool_hands_progress_on_and_waits_for_the_reply() -> None:
    pool = RankPool.__new__(RankPool)  # no processes: the pipes alone
    ours, theirs = Pipe()
    pool._connections = [ours]
    theirs.send((PROGRESS, "warm-up 1/1"))
    theirs.send((PROGRESS, "repeat 1/1: 3.00 tok/s (rank 0)"))
    theirs.send((DONE, "result"))
    seen: list[str] = []
    replies = pool._collect(5.0, expect=DONE, progress=seen.append)
    assert replies == {0: (DONE, "result")}
    assert seen == ["warm-up 1/1", "repeat 1/1: 3.00 tok/s (rank 0)"]


class _Terminal:
    """A reporter on a terminal of 60 columns whose line already holds `line`."""

    def __init__(self, line: str) -> None:
        self.isatty = True
        self.fullwidth = 60
        self.width_of_current_line = len(line)
        self.raw = line

    def write_raw(self, text: str, flush: bool = False) -> None:
        self.raw += text

    def screen(self) -> str:
        cells: list[str] = []
        column = 0
        for char in self.raw:
            if char == "\b":
                column = max(column - 1, 0)
                continue
            if column == len(cells):
                cells.append(char)
            else:
                cells[column] = char
            column += 1
        return "".join(cells).rstrip()


def _config(reporter: Any, verbosity: int = 0, capture: str = "fd") -> Any:
    plugins = {"terminalreporter": reporter, "capturemanager": None}
    return SimpleNamespace(
        pluginmanager=SimpleNamespace(get_plugin=plugins.get),
        get_verbosity=lambda: verbosity,
        getoption=lambda name, default=None: capture,
        get_terminal_writer=lambda: reporter,
    )


def test_live_line_leaves_pytests_line_as_it_was() -> None:
    terminal = _Terminal("test_perf.py ..")
    line = ProgressLine(_config(terminal))
    assert line.live and line.active
    line("warm-up 1/1")
    assert terminal.screen() == "test_perf.py ..  distperf: warm-up 1/1"
    line("repeat 1/5: 1234.56 tok/s (rank 0), and far more text than the line has room for")
    assert len(terminal.screen()) < terminal.fullwidth  # never wraps: backspaces cannot climb
    assert terminal.screen().startswith("test_perf.py ..  distperf: repeat 1/5: 1234.56")
    line.clear()
    assert terminal.screen() == "test_perf.py .."


@pytest.mark.parametrize(
    ("verbosity", "tty", "capture", "live", "lines"),
    [
        (-1, True, "fd", False, False),  # -q: quiet
        (0, False, "fd", False, False),  # a log file without -v: quiet
        (1, False, "fd", False, True),  # -v in a CI log: one line per message
        (0, True, "no", False, False),  # -s: the ranks' own output streams there
    ],
)
def test_when_the_line_shows(
    verbosity: int, tty: bool, capture: str, live: bool, lines: bool
) -> None:
    terminal = _Terminal("")
    terminal.isatty = tty
    line = ProgressLine(_config(terminal, verbosity, capture))
    assert (line.live, line.lines) == (live, lines)


TEST_TINY = """
import pytest

@pytest.mark.distperf(model="tiny", max_new_tokens=4, gates=False)
def test_rate(distperf):
    distperf.run()
"""


@pytest.mark.slow
def test_verbose_run_logs_progress(pytester: pytest.Pytester) -> None:
    # A quiet session's line: test_when_the_line_shows (the wiring is this session's).
    pytester.makepyfile(TEST_TINY)
    common = ("--distperf-accelerator=cpu", "--distperf-devices=2", "--distperf-repeats=2")
    common = (*common, "--distperf-count=off")  # the lines of the timed repeats
    verbose = pytester.runpytest_subprocess(*shared_cache(), "-v", *common)
    verbose.assert_outcomes(passed=1)
    verbose.stdout.fnmatch_lines(
        [
            "distperf: warm-up 1/1",
            "distperf: repeat 1/2: * tok/s (rank 0)",
            "distperf: repeat 2/2: * tok/s (rank 0)",
            "*test_rate[[]auto-2cpu[]] PASSED*",
        ]
    )
