"""The fast tier's guard: where FORBID_RANKS names a test (conftest.py sets it for every test
not marked `slow`), the rank pool and the launchers refuse to start rank processes, so a test
that would start them fails at once with a clear error instead of slowing the tier down.

`install()` wraps the plugin's rank starts with the refusal in this process; the pytest
sessions a fast test starts load this module too (PYTEST_PLUGINS, set by conftest.py beside
FORBID_RANKS), and with it the refusal; pytest-xdist's workers cannot (below).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest

FORBID_RANKS = "DISTPERF_FORBID_RANKS"
PLUGIN = "rank_guard"  # this module, as PYTEST_PLUGINS names it


def ranks_forbidden(environ: Mapping[str, str] = os.environ) -> str | None:
    """The test in which no rank may start, or None where ranks are allowed."""
    return environ.get(FORBID_RANKS) or None


def refuse_ranks(environ: Mapping[str, str] = os.environ) -> None:
    """Raise RuntimeError where rank processes are forbidden; call it right before spawning."""
    test = ranks_forbidden(environ)
    if test is not None:
        raise RuntimeError(f"rank processes are not allowed in {test}: mark it slow")


def _refusing(start: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(start, "refuses_ranks", False):
        return start

    @functools.wraps(start)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        refuse_ranks()
        return start(*args, **kwargs)

    refusing.refuses_ranks = True  # type: ignore[attr-defined]
    return refusing


def install() -> None:
    """Make every way the plugin starts ranks refuse where they are forbidden: the pool (and
    with it the session's early start), the fresh-ranks launcher, a job's run."""
    from pytest_distperf.launch import elastic, job, pool

    pool.RankPool.__init__ = _refusing(pool.RankPool.__init__)  # type: ignore[method-assign]
    elastic.launch = _refusing(elastic.launch)
    job.run_in_job = _refusing(job.run_in_job)


@pytest.hookimpl
def pytest_configure(config: pytest.Config) -> None:
    install()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    # xdist's local workers run on the sys.path their controller's interpreter started with,
    # where this module is not: PYTEST_PLUGINS would fail them, so they go without the guard.
    names = os.environ.get("PYTEST_PLUGINS", "").split(",")
    os.environ["PYTEST_PLUGINS"] = ",".join(name for name in names if name.strip() != PLUGIN)
