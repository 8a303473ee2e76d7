"""What one engine's delta says for RL bookkeeping: its generated tokens, and its weight-update
operations (the RL operation histogram's ``_sum`` / ``_count`` increases per ``operation``).
Exact sums of per-engine deltas; a baseline says nothing (0 / empty)."""

from __future__ import annotations

import math

from fleetscope import catalog
from fleetscope.stats.deltas import EngineDelta

__all__ = ["GENERATION_FAMILY", "RL_OPERATION_FAMILY", "generation_delta", "operation_deltas"]

GENERATION_FAMILY = "vllm:" + catalog.GENERATION_TOKENS.removesuffix("_total")
RL_OPERATION_FAMILY = catalog.RL_OPERATIONS


def generation_delta(d: EngineDelta) -> float:
    """Generated tokens of one engine in one interval (exact; 0 for a baseline)."""
    if d.baseline_only:
        return 0.0
    total = 0.0
    for c in d.layout.counters:
        if c.name == GENERATION_FAMILY:
            v = float(d.delta[c.slot])
            if not math.isnan(v):
                total += v
    return total


def operation_deltas(d: EngineDelta) -> dict[str, tuple[float, float]]:
    """Per ``operation``: the increase of the RL weight-update histogram's (_sum, _count)."""
    out: dict[str, tuple[float, float]] = {}
    if d.baseline_only:
        return out
    for h in d.layout.histograms:
        if h.name != RL_OPERATION_FAMILY:
            continue
        op = dict(h.labels).get("operation", "")
        s = float(d.delta[h.sum]) if h.sum >= 0 else math.nan
        n = float(d.delta[h.count]) if h.count >= 0 else math.nan
        ps, pn = out.get(op, (0.0, 0.0))
        out[op] = (ps + (0.0 if math.isnan(s) else s), pn + (0.0 if math.isnan(n) else n))
    return out
