"""What makes a collected pytest item a distperf item: the parameters `collection.parametrize`
gives it. Read by collection and by the xdist relay, which import nothing of each other."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

ARGNAMES = ("distperf_strategy", "distperf_devices")


def is_distperf(item: pytest.Item) -> bool:
    return ARGNAMES[0] in getattr(getattr(item, "callspec", None), "params", {})
