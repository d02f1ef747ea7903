"""The figures every report and benchmark states the same way: percentiles, a span of wall time, and a rate per
hour over it (success-only numerators: the callers pass what succeeded)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

import numpy as np

from jobs.db.base import as_utc


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """P50, P95, P99 (numpy's linear interpolation) and the maximum; None for no values."""
    if not len(values):
        return None
    return {q: float(np.percentile(values, int(q[1:]))) for q in ("p50", "p95", "p99")} | {"max": float(max(values))}


def ordered_sum(values: Iterable[float]) -> float:
    """Left to right, one addition at a time, as PostgreSQL's `sum(x ORDER BY id)` adds and as sum() did before Python
    3.12 (whose sum() compensates rounding): the report's two paths add seconds the same way, so their sums agree to
    the last bit. An int 0 for no values, as sum() gives."""
    total = 0
    for value in values:
        total += value
    return total


def span_s(starts: Iterable[datetime], ends: Iterable[datetime]) -> float:
    """Seconds from the earliest start to the latest end; 0 when either is empty."""
    starts, ends = [as_utc(t) for t in starts], [as_utc(t) for t in ends]
    return (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0


def per_hour(count: float, seconds: float) -> float | None:
    """`count` per hour over `seconds`; None over no time."""
    return 3600 * count / seconds if seconds else None
