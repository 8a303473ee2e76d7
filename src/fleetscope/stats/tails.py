"""Which engines hold a scope's latency tail over a window or run label (docs/rules.md §3.13).

Per latency histogram (:data:`TAIL_METRICS`: end-to-end latency and TTFT) and per scope (an
engine's role, else ``agg``; tails are taken within a role, docs/rules.md §3.6): the scope's
p99 is the one its keys show (pooled bucket increases, §3.5). Each engine's observations above
that p99 are counted from its own bucket increases (linear within the bucket that holds it, as
the quantile itself is interpolated). An engine **holds the tail** when its share of the
scope's observations above the p99 is at least :data:`TAIL_FACTOR` times its share of all the
scope's observations (a slow engine holds far more of the tail than of the traffic; engines
alike hold about their share, and none is named). Judged only over at least
:data:`MIN_OBSERVATIONS` observations in the scope (a p99 of fewer is its maximum), at most
:data:`MAX_TAIL_ENGINES` named, the most disproportionate first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fleetscope import catalog
from fleetscope.stats.engine_sum import EngineSum
from fleetscope.stats.quantiles import quantile_and_clamp
from fleetscope.stats.reduce import plan_for

__all__ = [
    "MAX_TAIL_ENGINES",
    "MIN_OBSERVATIONS",
    "TAIL_FACTOR",
    "TAIL_METRICS",
    "TailEngine",
    "count_above",
    "latency_tails",
    "tail_engines",
]

TAIL_METRICS: tuple[str, ...] = (catalog.E2E, catalog.TTFT)
TAIL_FACTOR = 2.0
MIN_OBSERVATIONS = 100.0
MAX_TAIL_ENGINES = 4

#: one engine's histogram over the interval: (engine id, bucket bounds, cumulative increases)
Buckets = tuple[str, Sequence[float], np.ndarray]


@dataclass(frozen=True, slots=True)
class TailEngine:
    """An engine that holds its scope's tail: its own p99, its share of the scope's
    observations above the scope's p99 and its share of all of them."""

    engine: str
    p99: float
    tail_share: float
    observation_share: float


def count_above(bounds: Sequence[float], counts: np.ndarray, value: float) -> float:
    """Observations above ``value`` in one histogram (cumulative ``counts`` at upper
    ``bounds``, the last ``+Inf``), linear within the bucket that holds ``value``."""
    total = float(counts[-1])
    lower, below = 0.0, 0.0
    cum: list[float] = counts.tolist()
    for b, c in zip(bounds, cum, strict=True):
        if value <= b:
            if math.isinf(b) or b <= lower:
                return total - below
            return total - (below + (c - below) * (value - lower) / (b - lower))
        lower, below = b, c
    return total - below


def tail_engines(rows: Sequence[Buckets], p99: float) -> list[TailEngine]:
    """The engines of one scope that hold its tail above ``p99`` (see the module doc)."""
    totals = [float(c[-1]) for _, _, c in rows]
    n = math.fsum(totals)
    if not n >= MIN_OBSERVATIONS or not math.isfinite(p99):
        return []
    above = [count_above(b, c, p99) for _, b, c in rows]
    a = math.fsum(above)
    if not a > 0:
        return []
    held: list[tuple[float, TailEngine]] = []
    for (eid, b, c), obs, up in zip(rows, totals, above, strict=True):
        share, tail = obs / n, up / a
        if share > 0 and tail >= TAIL_FACTOR * share:
            own = quantile_and_clamp(0.99, b, c)[0]
            held.append((tail / share, TailEngine(eid, own, tail, share)))
    held.sort(key=lambda x: -x[0])
    return [t for _, t in held[:MAX_TAIL_ENGINES]]


def _buckets(es: EngineSum, metric: str) -> tuple[Sequence[float], np.ndarray] | None:
    for h in plan_for(es.layout).histograms:
        if h.name == metric:
            counts = es.delta[h.buckets]
            if len(counts) and not np.isnan(counts).any() and counts[-1] > 0:
                return h.bounds, counts
    return None


def latency_tails(
    engines: Mapping[str, EngineSum], p99: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], list[TailEngine]]:
    """Per (scope, metric) whose p99 is given: the engines that hold that tail. An engine's
    scope is its role, else ``agg``."""
    rows: dict[tuple[str, str], list[Buckets]] = {}
    for eid, es in engines.items():
        if not es.is_engine:
            continue
        scope = es.role or "agg"
        for metric in TAIL_METRICS:
            if (scope, metric) not in p99:
                continue
            hist = _buckets(es, metric)
            if hist is not None:
                rows.setdefault((scope, metric), []).append((eid, hist[0], hist[1]))
    out: dict[tuple[str, str], list[TailEngine]] = {}
    for key, scope_rows in rows.items():
        out[key] = tail_engines(scope_rows, p99[key])
    return out
