"""Joining the pieces of one Ray engine: layouts merged, pieces told apart, stable labels."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fleetscope.catalog import RAY_PREFIXES
from fleetscope.exposition.snapshot import CounterSeries, EngineLayout, GaugeSeries, HistogramSeries

_ENGINE_PREFIXES = tuple(RAY_PREFIXES.values())  # "vllm:", "sglang:" (names after mapping)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # engine ids are `{endpoint}.{label}`; keys use "/"


@dataclass(slots=True)
class MergedLayout:
    sources: tuple[EngineLayout, ...]  # kept alive so their ids stay theirs
    layout: EngineLayout
    target: np.ndarray  # merged slot of every slot of the concatenated sources
    n: int


def has_series(layout: EngineLayout) -> bool:
    """Whether a piece carries engine metrics beyond info gauges."""
    series: list[CounterSeries | GaugeSeries | HistogramSeries] = [
        *layout.counters,
        *layout.gauges,
        *layout.histograms,
    ]
    return any(s.name.startswith(_ENGINE_PREFIXES) for s in series)


def is_engine(layout: EngineLayout) -> bool:
    """Whether a piece is (part of) an engine. A body without any `engine` tag comes out of
    the parser as one engine "0" made of Ray's own system metrics: not an engine."""
    return has_series(layout) or any(f.startswith(_ENGINE_PREFIXES) for f in layout.info)


def _safe(v: str) -> str:
    s = _UNSAFE.sub("_", v)
    return s if s == v else f"{s}-{hashlib.sha1(v.encode()).hexdigest()[:6]}"


def stable_labels(groups: Mapping[tuple[str, str, str], object]) -> dict[tuple[str, str, str], str]:
    """Stable labels, whatever the order of the body: a worker id's first 8 digits (all of
    them if two engines would share the label), else the replica id or model name."""
    out: dict[tuple[str, str, str], str] = {}
    for kind, value, engine in groups:
        out[(kind, value, engine)] = (
            f"{value[:8]}-{_safe(engine)}" if kind == "w" else f"{_safe(value)}-{_safe(engine)}"
        )
    counts: dict[str, int] = {}
    for label in out.values():
        counts[label] = counts.get(label, 0) + 1
    for (kind, value, engine), label in out.items():
        if counts[label] > 1:
            out[(kind, value, engine)] = f"{_safe(value)}-{_safe(engine)}-{kind}"
    return out


def merge_layouts(layouts: tuple[EngineLayout, ...]) -> MergedLayout:
    """The layout of several pieces of one engine; a series in two pieces is summed."""
    index: dict[str, int] = {}
    target: list[int] = []
    maps = []
    for lay in layouts:
        slot_map = [index.setdefault(sid, len(index)) for sid in lay.slot_ids]
        maps.append(slot_map)
        target.extend(slot_map)
    counters: dict[str, CounterSeries] = {}
    gauges: dict[str, GaugeSeries] = {}
    hists: dict[str, HistogramSeries] = {}
    info: dict[str, Mapping[str, str]] = {}
    model_name = None
    for lay, mp in zip(layouts, maps, strict=True):

        def at(slot: int, mp: list[int] = mp) -> int:
            return mp[slot] if slot >= 0 else -1

        for c in lay.counters:
            counters.setdefault(
                lay.slot_ids[c.slot], CounterSeries(c.name, c.labels, at(c.slot), at(c.created))
            )
        for g in lay.gauges:
            gauges.setdefault(lay.slot_ids[g.slot], GaugeSeries(g.name, g.labels, at(g.slot)))
        for h in lay.histograms:
            hists.setdefault(
                repr((h.name, h.labels)),
                HistogramSeries(
                    h.name,
                    h.labels,
                    h.bounds,
                    tuple(at(s) for s in h.buckets),
                    at(h.sum),
                    at(h.count),
                    at(h.created),
                ),
            )
        for fam, lab in lay.info.items():
            info.setdefault(fam, lab)
        model_name = model_name or lay.model_name
    layout = EngineLayout(
        slot_ids=tuple(index),
        counters=tuple(counters.values()),
        gauges=tuple(gauges.values()),
        histograms=tuple(hists.values()),
        info=info,
        model_name=model_name,
    )
    return MergedLayout(layouts, layout, np.array(target, dtype=np.intp), len(index))
