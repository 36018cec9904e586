"""House style as a test: ruff clean and formatted (ruff comes with the `test` extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The test environment's own ruff first: CI runs `.venv/bin/python -m pytest` without the
# environment's bin folder on PATH.
BESIDE = Path(sys.executable).parent / "ruff"
RUFF = str(BESIDE) if BESIDE.exists() else shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed (pip install -e .[test])")
@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args: list[str]) -> None:
    result = subprocess.run([RUFF, *args], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
