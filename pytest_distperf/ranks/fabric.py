"""Lightning Fabric for the ranks from `lightning_fabric` where installed: `import
lightning.fabric` imports all of Lightning, seconds of every rank's start."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import sys
from types import ModuleType


def fabric_module(submodule: str = "") -> ModuleType:
    """Fabric's package, or one of its submodules (`fabric_module("strategies").FSDPStrategy`)."""
    return importlib.import_module(f"{_package()}.{submodule}" if submodule else _package())


def fabric_version() -> str:
    return str(fabric_module().__version__)


class _WithoutTorchmetrics(importlib.abc.MetaPathFinder):
    """lightning_fabric imports torchmetrics only to compare its version for SpikeDetection,
    which no run uses: while Fabric is imported, torchmetrics reads as not installed."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name.split(".")[0] == "torchmetrics":
            raise ModuleNotFoundError(f"{name} is not imported with Fabric", name=name)
        return None


@functools.cache
def _package() -> str:
    """`lightning_fabric` where it imports, else Lightning's own `lightning.fabric`."""
    hide = _WithoutTorchmetrics()
    sys.meta_path.insert(0, hide)
    try:
        importlib.import_module("lightning_fabric")
        return "lightning_fabric"
    except ImportError:  # not installed (or broken without torchmetrics): use Lightning's own
        for name in [n for n in sys.modules if n.split(".")[0] == "lightning_fabric"]:
            del sys.modules[name]
        return "lightning.fabric"
    finally:
        sys.meta_path.remove(hide)
