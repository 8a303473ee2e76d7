"""Persistence of accumulators: engine layouts and per-engine sums as plain (JSON-able) data.

Non-finite floats are written as the strings ``"NaN"``, ``"+Inf"`` and ``"-Inf"``.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from fleetscope.exposition.snapshot import (
    CounterSeries,
    EngineLayout,
    EngineSnapshot,
    GaugeSeries,
    HistogramSeries,
)
from fleetscope.identity import EngineId
from fleetscope.stats.engine_sum import N_PHASES, EngineSum, no_phases


def engine_to_data(eid: str, a: EngineSum) -> dict[str, Any]:
    """One engine's sums as plain data: its layout, current values and sums by slot."""
    return {
        "id": engine_id_json(eid),
        "layout": layout_to_data(a.layout),
        "current": floats_to_json(a.current.data),
        "time": a.current.time,
        "wall_time": a.current.wall_time,
        "delta": floats_to_json(a.delta),
        "covered": a.covered,
        "spanned": a.spanned,
        "gauge_area": None if a.gauge_area is None else floats_to_json(a.gauge_area),
        "gauge_seconds": None if a.gauge_seconds is None else floats_to_json(a.gauge_seconds),
        "gauge_peak": None if a.gauge_peak is None else floats_to_json(a.gauge_peak),
        "role": a.role,
        "groups": list(a.groups),
        "is_engine": a.is_engine,
        "restarts": a.restarts,
        "retired": {k: [_jsonable(x) for x in v] for k, v in a.retired.items()},
        "phases": list(a.phases),
    }


def engine_from_data(e: Mapping[str, Any]) -> tuple[EngineId, EngineSum]:
    """The engine id and sums :func:`engine_to_data` wrote."""
    eid = EngineId.from_json(e["id"])
    lay = layout_from_data(e["layout"])
    snap = EngineSnapshot(eid, lay, floats_from_json(e["current"]), e["time"], e["wall_time"])

    def arr(v: list[float | str] | None) -> np.ndarray | None:
        return None if v is None else floats_from_json(v)

    delta = floats_from_json(e["delta"])
    return eid, EngineSum(
        lay,
        snap,
        delta,
        covered=float(e["covered"]),
        spanned=float(e.get("spanned", e["covered"])),
        gauge_area=arr(e["gauge_area"]),
        gauge_seconds=arr(e["gauge_seconds"]),
        gauge_peak=arr(e["gauge_peak"]),
        role=e["role"],
        groups=tuple(e["groups"]),
        is_engine=bool(e["is_engine"]),
        restarts=int(e["restarts"]),
        retired={
            k: (_from_json(v[0]), _from_json(v[1]), _from_json(v[2]), _from_json(v[3]))
            for k, v in e.get("retired", {}).items()
        },
        phases=_phases(e.get("phases")),
    )


def _phases(saved: list[float] | None) -> list[float]:
    """Engine-seconds per class as saved (a state saved before they were kept: none)."""
    out = no_phases()
    for i, v in enumerate((saved or [])[:N_PHASES]):
        out[i] = float(v)
    return out


_WRITTEN: weakref.WeakKeyDictionary[EngineLayout, dict[str, Any]] = weakref.WeakKeyDictionary()


def layout_to_data(layout: EngineLayout) -> dict[str, Any]:
    """An engine layout as plain data (its series, slots and info labels). Layouts are
    immutable and shared by the engines of one shape: written once, the same (read-only) dict
    for every engine, which pickle also stores once."""
    data = _WRITTEN.get(layout)
    if data is None:
        data = _WRITTEN[layout] = _layout_data(layout)
    return data


def _layout_data(layout: EngineLayout) -> dict[str, Any]:
    return {
        "slot_ids": list(layout.slot_ids),
        "counters": [
            [c.name, [list(x) for x in c.labels], c.slot, c.created] for c in layout.counters
        ],
        "gauges": [[g.name, [list(x) for x in g.labels], g.slot] for g in layout.gauges],
        "histograms": [
            [
                h.name,
                [list(x) for x in h.labels],
                [_jsonable(b) for b in h.bounds],
                list(h.buckets),
                h.sum,
                h.count,
                h.created,
            ]
            for h in layout.histograms
        ],
        "info": {k: dict(v) for k, v in layout.info.items()},
        "model_name": layout.model_name,
    }


_RESTORED: dict[str, EngineLayout] = {}


def layout_from_data(data: Mapping[str, Any]) -> EngineLayout:
    """The layout :func:`layout_to_data` wrote (one object per distinct layout)."""
    import json

    key = json.dumps(data, sort_keys=True)
    cached = _RESTORED.get(key)
    if cached is not None:
        return cached

    def labels(v: list[list[str]]) -> tuple[tuple[str, str], ...]:
        return tuple((str(a), str(b)) for a, b in v)

    layout = EngineLayout(
        slot_ids=tuple(data["slot_ids"]),
        counters=tuple(CounterSeries(n, labels(lab), s, c) for n, lab, s, c in data["counters"]),
        gauges=tuple(GaugeSeries(n, labels(lab), s) for n, lab, s in data["gauges"]),
        histograms=tuple(
            HistogramSeries(
                n, labels(lab), tuple(_from_json(b) for b in bounds), tuple(bk), sm, ct, cr
            )
            for n, lab, bounds, bk, sm, ct, cr in data["histograms"]
        ),
        info={k: dict(v) for k, v in data["info"].items()},
        model_name=data.get("model_name"),
    )
    if len(_RESTORED) > 1024:
        _RESTORED.clear()
    _RESTORED[key] = layout
    return layout


def floats_to_json(arr: np.ndarray) -> list[float | str]:
    finite = np.isfinite(arr)
    if finite.all():
        plain: list[float | str] = arr.tolist()
        return plain
    out = arr.astype(object)  # C speed: Python floats, then the strings by mask
    out[np.isnan(arr)] = "NaN"
    out[arr == np.inf] = "+Inf"
    out[arr == -np.inf] = "-Inf"
    mixed: list[float | str] = out.tolist()
    return mixed


def floats_from_json(values: list[float | str]) -> np.ndarray:
    if any(isinstance(x, str) for x in values):
        return np.array([_from_json(x) for x in values], dtype=float)
    return np.array(values, dtype=float)


def engine_id_json(engine: str) -> list[str | None]:
    return engine.to_json() if isinstance(engine, EngineId) else [engine, None]


def _jsonable(v: float) -> float | str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return float(v)


def _from_json(v: float | str) -> float:
    if isinstance(v, str):
        return {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}[v]
    return float(v)
