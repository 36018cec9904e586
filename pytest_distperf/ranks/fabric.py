"""Lightning Fabric for the ranks from `lightning_fabric` where installed: `import
lightning.fabric` imports all of Lightning, seconds of every rank's start."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from types import ModuleType

_STANDALONE = "lightning_fabric"
_BUNDLED = "lightning.fabric"
_chosen: list[str] = []  # the package found by the first call, then reused


def fabric_module(submodule: str = "") -> ModuleType:
    """Fabric's package, or one of its submodules (`fabric_module("strategies").FSDPStrategy`)."""
    if not _chosen:
        _chosen.append(_STANDALONE if _import_standalone() else _BUNDLED)
    name = f"{_chosen[0]}.{submodule}" if submodule else _chosen[0]
    return importlib.import_module(name)


def fabric_version() -> str:
    return str(fabric_module().__version__)


class _WithoutTorchmetrics(importlib.abc.MetaPathFinder):
    """lightning_fabric imports torchmetrics only to compare its version for SpikeDetection,
    which no run uses: while Fabric is imported, torchmetrics reads as not installed."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "torchmetrics" or name.startswith("torchmetrics."):
            raise ModuleNotFoundError(f"{name} is not imported with Fabric", name=name)
        return None


def _import_standalone() -> bool:
    hide = _WithoutTorchmetrics()
    sys.meta_path.insert(0, hide)
    try:
        importlib.import_module(_STANDALONE)
        return True
    except ImportError:  # not installed (or broken without torchmetrics): use Lightning's own
        for name in [n for n in sys.modules if n.split(".")[0] == _STANDALONE]:
            del sys.modules[name]
        return False
    finally:
        sys.meta_path.remove(hide)
