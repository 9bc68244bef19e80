"""Summaries the benchmarks share."""

from __future__ import annotations

import math
from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile: the smallest value with at least `q` of `values` at or below
    it (p99 of 300 waits is the 297th smallest); 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]
