"""A PromQL reference for classic-histogram quantiles.

``promql_bucket_quantile`` is an independent, straight transcription of PromQL's classic
``histogram_quantile`` rules (``bucketQuantile`` in ``promql/quantile.go``), written without
looking at fleetscope's implementation, so the two can be compared.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable


def _go_div(a: float, b: float) -> float:
    """IEEE division as Go does it (no ZeroDivisionError)."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def promql_bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """PromQL ``histogram_quantile`` over classic buckets ``[(le, cumulative count)]``.

    The rules, in Prometheus' order:
    q NaN -> NaN, q < 0 -> -Inf, q > 1 -> +Inf; sort by bound; the highest bound must be +Inf
    (else NaN); merge equal bounds by adding their counts; ignore float precision errors
    (a count within a relative 1e-12 of the last kept count takes that count); force a
    monotonic envelope (running maximum); fewer than 2 buckets or 0 observations -> NaN;
    rank = q * observations; the first finite bucket whose count reaches the rank holds it;
    a rank in +Inf -> the highest finite bound; the lowest bucket interpolates from 0 when its
    bound is positive (else its bound is the answer); linear interpolation inside the bucket.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda bc: bc[0])
    if not ordered or ordered[-1][0] != math.inf:
        return math.nan
    bounds: list[float] = []
    counts: list[float] = []
    for le, group in itertools.groupby(ordered, key=lambda bc: bc[0]):
        bounds.append(le)
        total = 0.0
        for _, c in group:
            total += c
        counts.append(total)
    kept = counts[0]
    for i in range(1, len(counts)):
        c = counts[i]
        diff = abs(c - kept)
        if diff == 0:
            continue
        if _go_div(diff, c) <= 1e-12:
            counts[i] = kept
        else:
            kept = c
    counts = list(itertools.accumulate(counts, max))
    if len(counts) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    last = len(counts) - 1
    b = bisect.bisect_left(counts, rank, 0, last)  # first finite bucket with count >= rank
    if b == last:
        return bounds[last - 1]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    lo = 0.0 if b == 0 else bounds[b - 1]
    below = 0.0 if b == 0 else counts[b - 1]
    return lo + (bounds[b] - lo) * _go_div(rank - below, counts[b] - below)
