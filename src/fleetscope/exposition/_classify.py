"""Sample classification (family, kind, kept labels) and per-engine layouts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from fleetscope.catalog import BREAKDOWN_LABELS, FAMILY_BREAKDOWNS, RAY_PREFIXES, canonical_family
from fleetscope.exposition._syntax import ExpositionError, Sample, format_bound, parse_float
from fleetscope.exposition.snapshot import (
    CounterSeries,
    EngineLayout,
    GaugeSeries,
    HistogramSeries,
    format_series,
)
from fleetscope.exposition.textformat import Labels

_SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total", "_gcount", "_gsum", "_info")
CUMULATIVE_KINDS = frozenset({"counter", "bucket", "count", "sum"})
# the kind of a histogram's or a summary's sample by its suffix (a bucket: histograms only)
_SUFFIX_KINDS = {"_created": "created", "_sum": "sum", "_count": "count"}

# layouts by shape, shared by all parsers (bounded: a shape not in it only loses sharing);
# one layout per shape keeps plans, alignments and reductions one matrix operation per shape
# (slot ids, their kinds, the info families and labels, the model name)
LayoutKey = tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, Labels], ...], str | None]
LAYOUTS: dict[LayoutKey, EngineLayout] = {}
_MAX_LAYOUTS = 1024


@dataclass(slots=True)
class SeriesDraft:
    kind: str  # counter | created | gauge | info | bucket | sum | count
    family: str
    labels: Labels
    le: float | None
    renamed: bool  # came from an old name; dropped when the current name is present
    model: str | None = None  # the sample's model_name label (summed away, kept for grouping)
    original: str | None = None  # the exposed family name (Ray's prefix undone), when mapped


class _HistogramParts(TypedDict, total=False):
    b: list[tuple[float, int]]  # (le, slot) per bucket
    sum: int
    count: int


def _suffixed_family(name: str, typ: str | None, types: dict[str, str]) -> tuple[str, str, str]:
    """A sample whose name is not a declared family (``x_bucket``, ``x_created``...), or a
    ``_created`` declared as its own gauge: its family, its suffix ("" for none) and the
    family's type ("untyped" when no TYPE line declares it)."""
    family, suffix = name, ""
    if typ is None:
        for suf in _SUFFIXES:
            if name.endswith(suf) and name[: -len(suf)] in types:
                family, suffix = name[: -len(suf)], suf
                typ = types[family]
                break
    if typ is None and name.endswith("_created"):
        base = name[:-8]
        if types.get(base + "_total") == "counter":
            family, suffix, typ = base + "_total", "_created", "counter"
    if typ is None:
        typ = "untyped"
    # `_created` declared as its own gauge family (0.0.4 format from prometheus_client)
    if typ == "gauge" and name.endswith("_created"):
        base = name[:-8]
        for cand in (base, base + "_total"):
            if types.get(cand) in ("counter", "histogram", "summary"):
                family, suffix, typ = cand, "_created", types[cand]
                break
    return family, suffix, typ


def _bucket_bound(le_str: str | None, s: Sample) -> float:
    """A histogram bucket's upper bound (its ``le`` label); NaN when it is not a number: that
    histogram is then invalid, the rest of the body is not (docs/rules.md §3.9)."""
    if le_str is None:
        raise ExpositionError("histogram bucket without le", s.line, s.name)
    try:
        return parse_float(le_str)
    except ValueError:
        return math.nan


def classify(
    s: Sample,
    types: dict[str, str],
    counter_bases: set[str],
    identity: tuple[str, ...],
    keep: tuple[str, ...] | None,
    escaped: dict[str, str] | None = None,
) -> SeriesDraft | None:
    name = s.name
    typ = types.get(name)
    family, suffix = name, ""
    if typ is None or (typ == "gauge" and name.endswith("_created")):
        family, suffix, typ = _suffixed_family(name, typ, types)
    if typ == "gauge" and name in counter_bases and name.startswith("ray_"):
        return None  # Ray OpenCensus exports counters twice; count the `_total` one only
    labels = dict(s.labels)
    # only a histogram's buckets read `le`: every other type keeps it as a breakdown label
    le_str = labels.pop("le", None) if typ == "histogram" else None

    if typ == "counter":
        base = family[:-6] if family.endswith("_total") else family
        kind = "created" if suffix == "_created" or name.endswith("_created") else "counter"
    elif typ in ("histogram", "summary"):
        base = family
        is_bucket = suffix == "_bucket" and typ == "histogram"
        kind = "bucket" if is_bucket else _SUFFIX_KINDS.get(suffix, "gauge")  # gauge: quantiles
    elif typ == "info" or (typ in ("gauge", "untyped") and name.endswith("_info")):
        base = name if typ != "info" else family
        if not base.endswith("_info"):
            base += "_info"
        kind = "info"
    else:  # gauge, untyped, unknown, stateset, gaugehistogram
        base, kind = name, "gauge"

    if escaped:
        base = escaped.get(base, base)
    for ray_prefix, prefix in RAY_PREFIXES.items():
        if base.startswith(ray_prefix):  # Ray's agent: `ray_sglang_x` is `sglang:x`
            base = prefix + base[len(ray_prefix) :]
            break
    canon, renamed = canonical_family(base)
    original = base if canon != base else None
    if keep is not None and not canon.startswith(keep):
        return None
    le = _bucket_bound(le_str, s) if kind == "bucket" else None
    if kind == "info":
        kept: Labels = tuple(sorted((k, v) for k, v in labels.items() if k not in identity))
    else:
        breakdown = FAMILY_BREAKDOWNS.get(canon, BREAKDOWN_LABELS)
        kept = tuple(sorted((k, v) for k, v in labels.items() if k in breakdown))
    return SeriesDraft(kind, canon, kept, le, renamed, s.labels.get("model_name"), original)


def series_id(d: SeriesDraft) -> str:
    if d.kind == "counter":
        return format_series(d.family + "_total", d.labels)
    if d.kind == "created":
        return format_series(d.family + "_created", d.labels)
    if d.kind == "bucket":
        assert d.le is not None
        labels = tuple(sorted((*d.labels, ("le", format_bound(d.le)))))
        return format_series(d.family + "_bucket", labels)
    if d.kind in ("sum", "count"):
        return format_series(f"{d.family}_{d.kind}", d.labels)
    if d.kind == "info":
        return d.family
    return format_series(d.family, d.labels)


def _add_histogram_part(part: _HistogramParts, d: SeriesDraft, slot: int) -> None:
    """A histogram sample's slot: one bucket (with its bound), the sum or the count."""
    if d.kind == "bucket":
        assert d.le is not None
        part["b"].append((d.le, slot))
    elif d.kind == "sum":
        part["sum"] = slot
    else:
        part["count"] = slot


def build_layout(
    rows: Sequence[tuple[int, SeriesDraft, float, int]],
) -> tuple[EngineLayout, dict[int, int]]:
    """Build (or reuse) the layout for one engine's samples; map each draft to its slot."""
    ids: dict[str, int] = {}
    slot_map: dict[int, int] = {}
    model_names: list[str] = []
    kinds: list[str] = []
    for _o, d, _v, _ln in rows:
        if d.model is not None and not model_names:
            model_names.append(d.model)
        sid = series_id(d)
        slot = ids.get(sid)
        if slot is None:
            slot = ids[sid] = len(ids)
            kinds.append(d.kind)
        slot_map[id(d)] = slot
    slot_ids = tuple(ids)
    key: LayoutKey = (
        slot_ids,
        tuple(kinds),
        tuple((d.family, d.labels) for _o, d, _v, _ln in rows if d.kind == "info"),
        model_names[0] if model_names else None,
    )
    cached = LAYOUTS.pop(key, None)
    if cached is not None:
        LAYOUTS[key] = cached  # most recently used last: eviction takes the oldest
        return cached, slot_map
    counters: list[CounterSeries] = []
    gauges: list[GaugeSeries] = []
    hist_parts: dict[tuple[str, Labels], _HistogramParts] = {}
    info: dict[str, dict[str, str]] = {}
    created_of: dict[tuple[str, Labels], int] = {}
    seen: set[str] = set()
    for _o, d, _v, _ln in rows:
        sid = series_id(d)
        if sid in seen:
            continue
        seen.add(sid)
        slot = ids[sid]
        if d.kind == "counter":
            counters.append(CounterSeries(d.family, d.labels, slot, -1))
        elif d.kind == "created":
            created_of[(d.family, d.labels)] = slot
        elif d.kind == "gauge":
            gauges.append(GaugeSeries(d.family, d.labels, slot))
        elif d.kind == "info":
            labels = dict(d.labels)
            if "model_name" in labels:
                model_names.append(labels["model_name"])
            info.setdefault(d.family, labels)
        else:
            _add_histogram_part(hist_parts.setdefault((d.family, d.labels), {"b": []}), d, slot)
    counters = [
        CounterSeries(c.name, c.labels, c.slot, created_of.get((c.name, c.labels), -1))
        for c in counters
    ]
    hists = []
    for (fam, hlabels), part in hist_parts.items():
        b = sorted(part["b"])
        hists.append(
            HistogramSeries(
                fam,
                hlabels,
                tuple(x for x, _ in b),
                tuple(s for _, s in b),
                part.get("sum", -1),
                part.get("count", -1),
                created_of.get((fam, hlabels), -1),
            )
        )
    layout = EngineLayout(
        slot_ids=slot_ids,
        counters=tuple(counters),
        gauges=tuple(gauges),
        histograms=tuple(hists),
        info=info,
        model_name=model_names[0] if model_names else None,
    )
    while len(LAYOUTS) >= _MAX_LAYOUTS:  # the oldest shape goes (not all: live ones stay shared)
        LAYOUTS.pop(next(iter(LAYOUTS)))
    LAYOUTS[key] = layout
    return layout, slot_map
