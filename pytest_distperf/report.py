"""Renderings of results: the JSON report (the terminal line lives beside the hooks)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPORT_SCHEMA = 1


def write_json_report(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> Path:
    """Write all rows atomically: a reader never sees half a report."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"schema": REPORT_SCHEMA, "results": list(rows)}, indent=2, sort_keys=True)
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text + "\n")
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target
