"""The ranks' Fabric: Lightning's standalone `lightning_fabric`, imported without the rest of
Lightning, or `lightning.fabric` where that package is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

REPORT = (
    "import json, sys\n"
    "from pytest_distperf.ranks.fabric import fabric_module\n"
    "from pytest_distperf.ranks.strategies import rank_strategy, BuildContext\n"
    "from pytest_distperf.platform import CPU\n"
    "strategy = rank_strategy('ddp').build(BuildContext(CPU, 2, (), 0))\n"
    "loaded = {m: m in sys.modules for m in ('lightning', 'lightning.pytorch', 'torchmetrics')}\n"
    "import torchmetrics  # the user's code may still import it\n"
    "print(json.dumps({'package': fabric_module().__name__, 'loaded': loaded,\n"
    "    'same': isinstance(strategy, fabric_module('strategies').DDPStrategy)}))\n"
)

# lightning_fabric as if not installed: only Lightning's bundled copy is left
HIDE_STANDALONE = (
    "import importlib.abc, sys\n"
    "class Hide(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name.split('.')[0] == 'lightning_fabric':\n"
    "            raise ModuleNotFoundError(name, name=name)\n"
    "sys.meta_path.insert(0, Hide())\n"
)


# Then as if that Fabric had never been imported, in the same interpreter (torch stays: it
# takes seconds to import).
FORGET_STANDALONE = (
    "for name in [n for n in sys.modules if n.split('.')[0] == 'lightning_fabric'\n"
    "             or n.startswith('pytest_distperf.ranks')]:\n"
    "    del sys.modules[name]\n"
)


@pytest.fixture(scope="module")
def reports() -> list[dict]:
    """The standalone package's report, then the report without it."""
    code = REPORT + FORGET_STANDALONE + HIDE_STANDALONE + REPORT
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [json.loads(line) for line in out.stdout.splitlines()[-2:]]


@pytest.mark.slow
def test_the_standalone_fabric_comes_without_lightning_pytorch_or_torchmetrics(
    reports: list[dict],
) -> None:
    report = reports[0]
    assert report["package"] == "lightning_fabric"
    assert not any(report["loaded"].values()), report["loaded"]
    assert report["same"]  # the strategies are of the package Fabric comes from


@pytest.mark.slow
def test_without_the_standalone_package_lightnings_own_fabric_is_used(
    reports: list[dict],
) -> None:
    report = reports[1]
    assert report["package"] == "lightning.fabric"
    assert report["same"]
