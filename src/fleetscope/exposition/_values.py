"""Value validation of one scrape: which series are invalid for it, and why (docs/rules.md §3.9).

Judged per template (the body's shape) by :func:`incomplete`; per scrape (the values) by
:func:`bad_ordinals` and :func:`overflowed`, a few vectorised numpy expressions on the fast path.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

import numpy as np

from fleetscope.exposition.snapshot import EngineLayout

#: a bucket's cumulative count may be this much (relative) below the one before it: float noise,
#: as PromQL's ``histogram_quantile`` tolerates (``stats.quantiles.PRECISION_TOLERANCE``)
BUCKET_TOLERANCE = 1e-12
_SHRINK = 1.0 / (1.0 + BUCKET_TOLERANCE)
#: the lowest valid value of a cumulative sample: 0, or any finite value (``_sum``, ``_created``)
NONNEG, FINITE = 0.0, -sys.float_info.max
_MAX = sys.float_info.max

BAD_LE = "bad le"
DECREASING = "buckets decrease"
OVERFLOW = "sum overflows"


def reason(v: float) -> str:
    """Why a cumulative sample's value is invalid."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return "negative"


def bad_ordinals(
    arr: np.ndarray,
    check_ords: np.ndarray,
    check_lower: np.ndarray,
    bucket_seq: np.ndarray,
    bucket_step: np.ndarray,
) -> dict[int, str]:
    """Samples (by ordinal) whose values are invalid, with why; empty when all are valid.

    ``check_ords``: cumulative samples, that must be finite and >= ``check_lower`` (:data:`NONNEG`
    or :data:`FINITE`). ``bucket_seq``: every histogram child's buckets as exposed, by ascending
    ``le``, children one after the other; ``bucket_step[i]``: ``bucket_seq[i + 1]`` is the next
    bucket of the same child, whose count must not be lower (beyond :data:`BUCKET_TOLERANCE`).
    Comparisons only (NaN compares false, the division cannot overflow): no numpy warning.
    """
    out: dict[int, str] = {}
    if len(check_ords):
        v = arr[check_ords]
        ok = (v >= check_lower) & (v <= _MAX)
        if np.count_nonzero(ok) != len(ok):
            out = {o: reason(float(arr[o])) for o in check_ords[~ok].tolist()}
    if len(bucket_step):
        b = arr[bucket_seq]
        dec = (b[:-1] * _SHRINK > b[1:]) & bucket_step
        if np.count_nonzero(dec):
            for o in bucket_seq[1:][dec].tolist():
                out.setdefault(o, DECREASING)
    return out


def overflowed(slots: np.ndarray, summed: np.ndarray) -> list[int]:
    """Slots holding the sum of several samples (children summed over labels fleetscope does
    not keep) that is not finite although each sample is: the sum overflowed float64."""
    ok = np.isfinite(slots[summed])
    if np.count_nonzero(ok) == len(ok):
        return []
    return summed[~ok].tolist()  # type: ignore[no-any-return]


def incomplete(layout: EngineLayout) -> tuple[tuple[int, str], ...]:
    """Histogram children invalid in every body of this shape (by group): a bucket whose ``le``
    is not a number, no ``+Inf`` bucket, no ``_count`` (docs/rules.md §3.9)."""
    out = []
    n = len(layout.counters)
    for j, h in enumerate(layout.histograms):
        if not h.buckets:
            continue  # a summary: `_sum` / `_count` only
        if any(math.isnan(b) for b in h.bounds):
            out.append((n + j, BAD_LE))
        elif h.bounds[-1] != math.inf:
            out.append((n + j, "no +Inf bucket"))
        elif h.count < 0:
            out.append((n + j, "no _count"))
    return tuple(out)


def bucket_chain(
    children: Iterable[list[tuple[float, int]]], kept: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``bucket_seq`` and ``bucket_step`` of :func:`bad_ordinals` from each histogram child's
    ``(le, ordinal)`` pairs as exposed (``kept``: per ordinal, whether its sample is kept).
    Buckets whose ``le`` is not a number are left out (their histogram is invalid anyway)."""
    seq: list[int] = []
    step: list[bool] = []
    for buckets in children:
        chain = sorted((le, o) for le, o in buckets if not math.isnan(le) and kept[o])
        if len(chain) < 2:
            continue
        if seq:
            step[-1] = False  # the last bucket of the previous child: no step to this one
        seq.extend(o for _, o in chain)
        step.extend([True] * len(chain))
    if step:
        step.pop()  # the last bucket has no next one
    return np.array(seq, dtype=np.intp), np.array(step, dtype=bool)
