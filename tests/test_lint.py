"""House style as a test: ruff clean and formatted (ruff comes with the `test` extra)."""

from __future__ import annotations

import ast
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


# DESIGN.md: a module has one role and at most ~500 lines; the issue that split the rank side
# set 80 lines as the most a function may take.
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500


def _too_long_functions(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name} has {lines} lines")
    return found


def test_the_length_check_sees_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert _too_long_functions(f"def f():\n{body}\n", "m.py") == ["m.py:1 f has 81 lines"]


def test_no_function_or_module_of_the_plugin_is_too_long() -> None:
    found = []
    for path in sorted((ROOT / "pytest_distperf").rglob("*.py")):
        source = path.read_text()
        where = str(path.relative_to(ROOT))
        found += _too_long_functions(source, where)
        if source.count("\n") > MAX_MODULE_LINES:
            found.append(f"{where} has {source.count(chr(10))} lines")
    assert not found, "\n".join(found)
