"""Renderings of results: the JSON report (the terminal table lives beside the hooks)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .files import atomic_write_text

REPORT_SCHEMA = 1


def write_json_report(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> Path:
    """Write all rows atomically: a reader never sees half a report."""
    text = json.dumps({"schema": REPORT_SCHEMA, "results": list(rows)}, indent=2, sort_keys=True)
    return atomic_write_text(path, text + "\n")
