"""Per-endpoint figures of vLLM's engine-less operation families, every poll, in every window
and in the run summary.

vLLM's RL weight-update and sleep-mode handlers (``vllm:rl_weight_update_operation_duration_
seconds{operation}``, ``vllm:sleep_mode_operation_duration_seconds{operation}`` and their
``..._operations_in_flight{operation}`` gauges) carry no ``engine`` label: they belong to the
endpoint (its own row, ``inference/server0/...``; docs/rules.md §3.11). The general reduction
gives every scope (fleet, role, user group) their counts, pooled quantiles and means; an
endpoint row's per-engine keys are its raw values. This module adds, per endpoint and
operation, what the scopes have, from the endpoint's own deltas (exact, PromQL's rules):

* ``{base}/{endpoint}/{histogram}{operation=x}/delta``: calls (the count's increase);
* ``.../{histogram}{operation=x}_sum/delta``: seconds spent in them (the sum's increase);
* ``.../{histogram}{operation=x}/p50|p90|p99``: ``histogram_quantile`` of the bucket increases
  (no calls: no value);
* windows and the summary: ``.../{gauge}{operation=x}/mean`` (time-weighted) and ``/peak``;
* per scope (``agg``, ``prefill``, ``decode``): ``{base}/{scope}/{histogram}{operation=x}_sum/
  delta``, the exact seconds (the scope's own keys have the count, quantiles and means).

Above :data:`COMPACT_ENDPOINTS` endpoints the per-endpoint keys are in the full key set only
(W&B's compact default keeps the scopes).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetscope.catalog import OPERATION_FAMILIES, label_suffix
from fleetscope.exposition.snapshot import EngineLayout
from fleetscope.identity import Role, endpoint_of
from fleetscope.keys import KeyDict
from fleetscope.stats.plans import metric_name
from fleetscope.stats.quantiles import bucket_quantile

QUANTILES = (0.5, 0.9, 0.99)
#: more endpoints than this: the per-endpoint keys are full-set only
COMPACT_ENDPOINTS = 32


@dataclass(frozen=True, slots=True)
class _Histogram:
    metric: str  # ``rl_weight_update_operation_duration_seconds{operation=update}``
    bounds: tuple[float, ...]
    buckets: np.ndarray
    sum: int
    count: int


@dataclass(frozen=True, slots=True)
class _Slots:
    histograms: tuple[_Histogram, ...]
    gauges: tuple[tuple[str, int], ...]  # (metric, slot) of the in-flight gauges

    def __bool__(self) -> bool:
        return bool(self.histograms or self.gauges)


_CACHE: weakref.WeakKeyDictionary[EngineLayout, _Slots] = weakref.WeakKeyDictionary()


def _slots(layout: EngineLayout) -> _Slots:
    """The operation families' slots of a layout (computed once per layout)."""
    found = _CACHE.get(layout)
    if found is not None:
        return found
    gauges_of = set(OPERATION_FAMILIES.values())
    hists = tuple(
        _Histogram(
            metric_name(h.name) + label_suffix(h.labels),
            h.bounds,
            np.array(h.buckets, dtype=np.intp),
            h.sum,
            h.count,
        )
        for h in layout.histograms
        if h.name in OPERATION_FAMILIES and h.count >= 0 and h.sum >= 0
    )
    gauges = tuple(
        (metric_name(g.name) + label_suffix(g.labels), g.slot)
        for g in layout.gauges
        if g.name in gauges_of
    )
    found = _Slots(hists, gauges)
    _CACHE[layout] = found
    return found


@dataclass(frozen=True, slots=True)
class EndpointRow:
    """One endpoint's own row over an interval: its layout, summed increases (NaN: unknown)
    and, for windows, each gauge slot's time-weighted mean and peak (None for a poll)."""

    name: str
    role: Role | None
    layout: EngineLayout
    delta: np.ndarray
    gauge_mean: np.ndarray | None = None
    gauge_peak: np.ndarray | None = None


def operation_keys(rows: Iterable[EndpointRow], base: str) -> KeyDict:
    """The per-endpoint and per-scope keys above, for ``rows`` (endpoint rows only)."""
    out = KeyDict()
    per_endpoint: list[str] = []
    scope_seconds: dict[tuple[str, str], float] = {}
    endpoints = 0
    for row in rows:
        slots = _slots(row.layout)
        if not slots:
            continue
        endpoints += 1
        prefix = f"{base}/{row.name}/"
        scopes = ("agg",) if row.role is None else ("agg", row.role)
        for h in slots.histograms:
            calls, seconds = float(row.delta[h.count]), float(row.delta[h.sum])
            if not (math.isfinite(calls) and math.isfinite(seconds)):
                continue  # not observed over this interval: no figure rather than a wrong one
            per_endpoint += _put(out, prefix + h.metric + "/delta", calls)
            per_endpoint += _put(out, prefix + h.metric + "_sum/delta", seconds)
            for scope in scopes:
                key = (scope, h.metric)
                scope_seconds[key] = scope_seconds.get(key, 0.0) + seconds
            if calls > 0:
                counts = row.delta[h.buckets]
                if np.isfinite(counts).all():
                    for q in QUANTILES:
                        v = bucket_quantile(q, h.bounds, counts)
                        per_endpoint += _put(out, f"{prefix}{h.metric}/p{round(q * 100)}", v)
        if row.gauge_mean is not None and row.gauge_peak is not None:
            for metric, slot in slots.gauges:
                per_endpoint += _put(out, f"{prefix}{metric}/mean", float(row.gauge_mean[slot]))
                per_endpoint += _put(out, f"{prefix}{metric}/peak", float(row.gauge_peak[slot]))
    for (scope, metric), seconds in scope_seconds.items():
        _put(out, f"{base}/{scope}/{metric}_sum/delta", seconds)  # past float64: no figure
    if endpoints > COMPACT_ENDPOINTS:
        out.full_only.update(per_endpoint)
    return out


def _put(out: dict[str, Any], key: str, value: float) -> list[str]:
    if math.isfinite(value):
        out[key] = value
        return [key]
    return []


def poll_rows(inputs: Sequence[Any]) -> list[EndpointRow]:
    """A poll's endpoint rows (``fleet.EngineInput`` items that are no engine)."""
    rows = []
    for inp in inputs:
        d = inp.delta
        if inp.is_engine or d.baseline_only:
            continue
        rows.append(EndpointRow(endpoint_of(inp.engine_id), inp.role, d.layout, d.delta))
    return rows


def accumulator_rows(engines: Any) -> list[EndpointRow]:
    """A window's or run label's endpoint rows (``Accumulator.engines``)."""
    rows = []
    for eid, a in engines.items():
        if a.is_engine:
            continue
        mean = peak = None
        if a.gauge_area is not None and a.gauge_seconds is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(a.gauge_seconds > 0, a.gauge_area / a.gauge_seconds, np.nan)
            peak = a.gauge_peak
        rows.append(EndpointRow(endpoint_of(eid), a.role, a.layout, a.delta, mean, peak))
    return rows
