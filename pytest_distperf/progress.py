"""A live progress line from rank 0's texts while a test's ranks run: on a terminal after pytest's
line, wiped before the outcome; else one line per text under `-v`, none otherwise."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest

PREFIX = "  distperf: "


class ProgressLine:
    """Callable with one progress text; `clear()` wipes what is shown."""

    def __init__(self, config: pytest.Config) -> None:
        self._reporter: Any = config.pluginmanager.get_plugin("terminalreporter")
        self._capture: Any = config.pluginmanager.get_plugin("capturemanager")
        verbosity = config.get_verbosity()
        reporter = self._reporter
        # A live line needs a terminal that honours backspaces; with -s the ranks' own output
        # streams onto the same lines.
        self.live = (
            reporter is not None
            and verbosity >= 0
            and bool(reporter.isatty)
            and hasattr(reporter, "write_raw")
            and config.getoption("capture", None) != "no"
        )
        self.lines = reporter is not None and not self.live and verbosity > 0
        self._writer: Any = config.get_terminal_writer() if reporter is not None else None
        self._shown = 0  # characters of ours on the terminal's current line

    @property
    def active(self) -> bool:
        return self.live or self.lines

    def __call__(self, text: str) -> None:
        if not self.active:
            return
        with self._uncaptured():
            if self.lines:
                self._reporter.write_line(PREFIX.lstrip() + text)
                return
            # Backspaces cannot climb back over a wrapped line: stay within this one.
            room = self._writer.fullwidth - self._writer.width_of_current_line - 1
            shown = (PREFIX + text)[: max(room, 0)]
            # Raw writes leave pytest's idea of the current line alone: the line ends as it was.
            self._reporter.write_raw(self._erase() + shown, flush=True)
            self._shown = len(shown)

    def clear(self) -> None:
        if self._shown:
            with self._uncaptured():
                self._reporter.write_raw(self._erase(), flush=True)

    def _erase(self) -> str:
        n, self._shown = self._shown, 0
        return "\b" * n + " " * n + "\b" * n

    def _uncaptured(self) -> Any:
        # The ranks run inside the test's call, while pytest captures this process's output.
        if self._capture is None:
            return nullcontext()
        return self._capture.global_and_fixture_disabled()
