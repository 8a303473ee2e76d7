"""Histogram quantiles exactly as PromQL's ``histogram_quantile`` computes them (classic buckets).

Mirrors Prometheus' ``bucketQuantile``: buckets sorted by bound, equal bounds coalesced, float
precision errors (relative 1e-12) and non-monotonic counts corrected, linear interpolation within
the bucket, a lower edge of 0 for the lowest bucket when its bound is positive, and the highest
finite bound when the rank falls in ``+Inf``. Returns NaN where PromQL returns NaN.

Pooling across engines with different bucket layouts uses the **intersection** of their bounds:
each engine's cumulative count at a shared bound is exact, so the pooled cumulative counts are
exact too. Summing on the union (what ``sum by (le)`` does) mixes cumulative counts taken at
different bounds and is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

PRECISION_TOLERANCE = 1e-12


def _coalesced(pairs: list[tuple[float, float]]) -> list[list[float]]:
    """(bound, count) pairs sorted by bound, equal bounds coalesced (their counts summed)."""
    merged: list[list[float]] = []
    for b, c in pairs:
        if merged and merged[-1][0] == b:
            merged[-1][1] += c
        else:
            merged.append([b, c])
    return merged


def _correct_counts(merged: list[list[float]]) -> None:
    """Float precision errors (relative ``PRECISION_TOLERANCE``) corrected, then the counts
    forced monotonic, in place."""
    prev = merged[0][1]
    for i in range(1, len(merged)):
        curr = merged[i][1]
        delta = abs(curr - prev)
        if delta == 0:
            continue
        eps = delta / curr if curr != 0 else math.inf
        if eps <= PRECISION_TOLERANCE:
            merged[i][1] = prev
        else:
            prev = curr
    top = merged[0][1]
    for i in range(1, len(merged)):
        if merged[i][1] > top:
            top = merged[i][1]
        elif merged[i][1] < top:
            merged[i][1] = top


def _interpolated(merged: list[list[float]], rank: float) -> float:
    """The value at ``rank``: linear within its bucket (lower edge 0 for the lowest bucket
    when its bound is positive), the highest finite bound when it falls in ``+Inf``."""
    n = len(merged) - 1
    b = n
    for i in range(n):  # first bucket (excluding +Inf) whose count reaches the rank
        if merged[i][1] >= rank:
            b = i
            break
    if b == n:
        return merged[n - 1][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start = 0.0
    end = merged[b][0]
    count = merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    if count == 0:
        return math.nan if rank == 0 else math.copysign(math.inf, rank) * (end - start)
    return start + (end - start) * (rank / count)


def bucket_quantile(
    q: float, bounds: Sequence[float], counts: Sequence[float] | np.ndarray
) -> float:
    """The q-quantile of cumulative ``counts`` at upper ``bounds`` (PromQL semantics)."""
    return quantile_and_clamp(q, bounds, counts)[0]


def quantile_and_clamp(
    q: float, bounds: Sequence[float], counts: Sequence[float] | np.ndarray
) -> tuple[float, bool]:
    """:func:`bucket_quantile`, and whether its rank fell in the ``+Inf`` bucket: the value is
    then the highest finite bound, a floor of the true quantile (a *clamped* tail)."""
    if math.isnan(q):
        return math.nan, False
    if q < 0:
        return -math.inf, False
    if q > 1:
        return math.inf, False
    if not len(bounds):
        return math.nan, False
    pairs = sorted(zip((float(b) for b in bounds), (float(c) for c in counts), strict=True))
    if not math.isinf(pairs[-1][0]) or pairs[-1][0] < 0:
        return math.nan, False
    merged = _coalesced(pairs)
    _correct_counts(merged)
    if len(merged) < 2:
        return math.nan, False
    observations = merged[-1][1]
    if observations == 0 or math.isnan(observations):
        return math.nan, False
    rank = q * observations
    return _interpolated(merged, rank), merged[-2][1] < rank


def shared_bounds(layouts: Iterable[Sequence[float]]) -> tuple[float, ...]:
    """The bounds present in every layout, ascending."""
    it = iter(layouts)
    first = next(it, None)
    if first is None:
        return ()
    common = set(first)
    for bounds in it:
        common.intersection_update(bounds)
    return tuple(sorted(common))


def pool_buckets(
    histograms: Sequence[tuple[Sequence[float], Sequence[float] | np.ndarray]],
) -> tuple[tuple[float, ...], np.ndarray]:
    """Sum cumulative bucket counts of several histograms on the intersection of their bounds.

    Each item is (bounds, cumulative counts). Buckets with unknown counts (NaN) are dropped
    from that histogram's bounds first, so one engine's missing baseline never poisons a bound.
    """
    cleaned = []
    for bounds, counts in histograms:
        c = np.asarray(counts, dtype=np.float64)
        keep = ~np.isnan(c)
        b = tuple(x for x, k in zip(bounds, keep, strict=True) if k)
        cleaned.append((b, c[keep]))
    if not cleaned:
        return (), np.zeros(0)
    common = shared_bounds(b for b, _ in cleaned)
    total = np.zeros(len(common))
    with np.errstate(over="ignore", invalid="ignore"):  # past float64: inf, checked by reduce
        for b, c in cleaned:
            if b == common:
                total += c
            else:
                pos = {x: i for i, x in enumerate(b)}
                total += c[[pos[x] for x in common]]
    return common, total


def pooled_quantiles(
    histograms: Sequence[tuple[Sequence[float], Sequence[float] | np.ndarray]],
    qs: Sequence[float] = (0.5, 0.9, 0.99),
) -> list[float]:
    """Quantiles of the pooled histogram (NaN when there are no observations)."""
    bounds, counts = pool_buckets(histograms)
    return [bucket_quantile(q, bounds, counts) for q in qs]
