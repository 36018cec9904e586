"""The layout's rules as tests: what each part of the plugin pulls in when imported alone.

Rank code never pulls pytest (it runs in rank processes that have no pytest session); the pure
and pytest-side parts never pull torch (importing the plugin must stay cheap). Each import runs
in a fresh interpreter, so modules loaded by other tests cannot hide a stray import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pytest_distperf"

# part -> modules it must never pull in
FORBIDDEN = {
    "pytest_distperf.ranks": ("pytest", "_pytest", "lightning", "lightning_fabric"),
    "pytest_distperf.perfmodel": ("torch",),
    "pytest_distperf.judge": ("torch",),
    "pytest_distperf.store": ("torch",),
    "pytest_distperf.topology": ("torch",),
    "pytest_distperf.output": ("torch",),
    "pytest_distperf.strategies": ("torch", "lightning", "lightning_fabric"),
    "pytest_distperf.spec": ("torch", "pytest"),
    "pytest_distperf.options": ("torch",),
    "pytest_distperf.plugin": ("torch",),
    "pytest_distperf.markers": ("torch",),
    "pytest_distperf.models": ("torch",),
    "pytest_distperf.launch": ("torch",),
    "pytest_distperf.jsonfields": ("torch",),
    "pytest_distperf.gitinfo": ("torch",),
    "pytest_distperf.collection": ("torch",),
    "pytest_distperf.header": ("torch",),
    "pytest_distperf.progress": ("torch",),
    "pytest_distperf.xdist": ("torch", "xdist"),
}


def _submodules(part: str) -> list[str]:
    path = ROOT / Path(*part.split("."))
    if path.is_dir():
        return [
            f"{part}.{p.stem}" if p.stem != "__init__" else part for p in sorted(path.glob("*.py"))
        ]
    return [part]


def _loaded_after_import(module: str) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


CHECKED = [
    (module, forbidden) for part, forbidden in FORBIDDEN.items() for module in _submodules(part)
]


@pytest.fixture(scope="module")
def imports() -> dict[str, Future[set[str]]]:
    """Every checked module imported in its own interpreter, as many at once as there are CPUs."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {module: pool.submit(_loaded_after_import, module) for module, _ in CHECKED}
        wait(futures.values())
    return futures


@pytest.mark.parametrize(("module", "forbidden"), CHECKED)
def test_module_pulls_in_nothing_forbidden(
    module: str, forbidden: tuple[str, ...], imports: dict[str, Future[set[str]]]
) -> None:
    loaded = imports[module].result()  # raises here what that import raised
    pulled = sorted(name for name in forbidden if name in loaded)
    assert not pulled, f"importing {module} pulls in {', '.join(pulled)}"


def test_every_module_belongs_to_a_checked_part() -> None:
    """A new top-level module or subpackage must be given its rule above."""
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    unchecked = sorted(parts - {"__init__", "cli"} - {name.split(".")[1] for name in FORBIDDEN})
    assert not unchecked, f"no import rule for pytest_distperf.{unchecked}"


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*PACKAGE.rglob("*.py"), *(ROOT / "model").glob("*.py")]
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long, f"modules over 500 lines (DESIGN.md: one role, at most ~500): {long}"
