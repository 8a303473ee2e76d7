"""Held rows: what a boundary poll (or a poll over a sliver) shows, and how the row after it
joins each engine's held increase with its own (docs/bad-data.md §11, rules §3 item 12)."""

from __future__ import annotations

import dataclasses

import numpy as np

from fleetscope.exposition.snapshot import EngineLayout
from fleetscope.stats.deltas import alignment
from fleetscope.stats.reduce import QUANTILE_STATS, EngineInput, PollStats, ScopeStats

_INSTANT_KINDS = frozenset({"gauge", "total", "const"})
_INTERVAL_STATS = QUANTILE_STATS | {"delta", "pooled"}


def instant_view(stats: PollStats) -> PollStats:
    """``stats`` without what needs an interval: rates, ratios, quantiles, increases."""
    keep = np.array([stats.kinds.get(c) in _INSTANT_KINDS for c in stats.columns], dtype=bool)
    matrix = np.where(keep[None, :], stats.matrix, np.nan)
    scopes = {}
    for name, sc in stats.scopes.items():
        metrics = {
            m: {k: v for k, v in per.items() if k not in _INTERVAL_STATS}
            for m, per in sc.metrics.items()
            if stats.kinds.get(m, "gauge") in _INSTANT_KINDS
        }
        scopes[name] = ScopeStats(sc.engines, {m: per for m, per in metrics.items() if per})
    return dataclasses.replace(stats, matrix=matrix, scopes=scopes)


def joined(held: EngineInput | None, cur: EngineInput) -> EngineInput:
    """One engine's held boundary delta and its current one, as one delta over both
    intervals (docs/bad-data.md §11). Increases add up whatever happened in between: after a
    restart the current delta counts from 0, so held + current is still the interval's
    increase; when the engine's series layout changed, the held increases are carried to the
    same series of the current layout (a series the current layout no longer has is left to
    the windows, which keep it exactly)."""
    if held is None:
        return cur
    a, b = held.delta, cur.delta
    if a.baseline_only:
        return cur
    prior = a.delta if a.layout is b.layout else realigned(a.delta, a.layout, b.layout)
    # a slot unknown in the held delta takes the current one's; else the two add up
    with np.errstate(over="ignore", invalid="ignore"):  # past float64: inf, named by reduce
        both = np.where(np.isnan(prior), b.delta, prior + np.nan_to_num(b.delta))
    joined = dataclasses.replace(
        b,
        delta=both,
        seconds=a.seconds + b.seconds,
        span=None,
        observed_seconds=a.observed_seconds + b.observed_seconds,
        baseline_only=False,
        restarted=a.restarted or b.restarted,
        started=a.started or b.started,
        tail_unseen=a.tail_unseen or b.tail_unseen,
    )
    return dataclasses.replace(cur, delta=joined)


def realigned(values: np.ndarray, old: EngineLayout, new: EngineLayout) -> np.ndarray:
    """``values`` (per slot of ``old``) moved to the slots of the same series in ``new``;
    NaN where ``new`` has a series ``old`` did not (or of another kind)."""
    idx, _ = alignment(old, new)
    out = np.full(len(idx), np.nan)
    hit = idx >= 0
    out[hit] = values[idx[hit]]
    return out
