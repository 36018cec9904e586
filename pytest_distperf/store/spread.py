"""The spread of a baseline's samples, stored in each entry and read by the judge's tolerance.

Lives with the store (the lower layer): an entry computes its dispersion when it is built, and
the judge imports it from here. Pure; scipy is imported when a spread is computed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_distperf.jsonfields import is_number

# 1.4826 * MAD estimates the standard deviation for normal data (1 / Phi^-1(3/4)), so the spread
# below is on the same scale as a coefficient of variation, yet one wild repeat cannot inflate it.
MAD_TO_SIGMA = 1.4826


def checked_rates(samples: Sequence[float], name: str) -> list[float]:
    """The samples as floats; a ValueError naming `name` when one is no finite positive rate."""
    values = list(samples)
    if not values:
        raise ValueError(f"{name}: no samples")
    for v in values:
        if not is_number(v):
            raise ValueError(f"{name}: samples must be numbers, got {v!r}")
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name}: rates must be finite and positive, got {v!r}")
    return [float(v) for v in values]


def relative_spread(samples: Sequence[float]) -> float:
    """Robust relative spread: 1.4826 * MAD / median (a CV that ignores a single outlier)."""
    from scipy.stats import median_abs_deviation  # lazy: scipy.stats is slow to import

    values = checked_rates(samples, "samples")
    return MAD_TO_SIGMA * float(median_abs_deviation(values)) / statistics.median(values)
