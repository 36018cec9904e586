"""House style as a test: ruff clean and formatted (ruff comes with the `test` extra)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(
    shutil.which("ruff") is None, reason="ruff is not installed (pip install -e .[test])"
)
@pytest.mark.parametrize("command", [["ruff", "check", "."], ["ruff", "format", "--check", "."]])
def test_ruff(command: list[str]) -> None:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
