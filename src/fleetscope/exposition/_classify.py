"""Sample classification (family, kind, kept labels) and per-engine layouts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetscope.catalog import BREAKDOWN_LABELS, FAMILY_BREAKDOWNS, RAY_PREFIXES, canonical_family
from fleetscope.exposition._syntax import ExpositionError, Sample, format_bound, parse_float
from fleetscope.exposition.snapshot import (
    CounterSeries,
    EngineLayout,
    GaugeSeries,
    HistogramSeries,
    Labels,
    format_series,
)

_SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total", "_gcount", "_gsum", "_info")
CUMULATIVE_KINDS = frozenset({"counter", "bucket", "count", "sum"})

# layouts by shape, shared by all parsers (bounded: a shape not in it only loses sharing);
# one layout per shape keeps plans, alignments and reductions one matrix operation per shape
LAYOUTS: dict[tuple, EngineLayout] = {}
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


def _family_of(name: str, types: dict[str, str]) -> tuple[str, str, str]:
    """The sample's family, its suffix (``_bucket``, ``_total``, ...; "" for none) and the
    family's declared type ("untyped" when no TYPE line declares it)."""
    typ = types.get(name)
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


def _histogram_kind(typ: str, suffix: str) -> str:
    """The kind of a histogram's or a summary's sample, by its suffix."""
    if suffix == "_created":
        return "created"
    if suffix == "_bucket" and typ == "histogram":
        return "bucket"
    if suffix == "_sum":
        return "sum"
    if suffix == "_count":
        return "count"
    return "gauge"  # summary quantiles


def _base_and_kind(name: str, typ: str, family: str, suffix: str) -> tuple[str, str]:
    """The series' base name (before Ray's prefix and renames are undone) and its kind."""
    if typ == "counter":
        base = family[:-6] if family.endswith("_total") else family
        kind = "created" if suffix == "_created" or name.endswith("_created") else "counter"
        return base, kind
    if typ in ("histogram", "summary"):
        return family, _histogram_kind(typ, suffix)
    if typ == "info" or (typ in ("gauge", "untyped") and name.endswith("_info")):
        base = name if typ != "info" else family
        if not base.endswith("_info"):
            base += "_info"
        return base, "info"
    return name, "gauge"  # gauge, untyped, unknown, stateset, gaugehistogram


def _unprefixed(base: str, escaped: dict[str, str] | None) -> str:
    """The name the catalog knows: OpenMetrics' escaped ``:`` and Ray's prefix undone."""
    if escaped:
        base = escaped.get(base, base)
    for ray_prefix, prefix in RAY_PREFIXES.items():
        if base.startswith(ray_prefix):  # Ray's agent: `ray_sglang_x` is `sglang:x`
            return prefix + base[len(ray_prefix) :]
    return base


def _bucket_bound(le_str: str | None, s: Sample) -> float:
    """A histogram bucket's upper bound (its ``le`` label)."""
    if le_str is None:
        raise ExpositionError("histogram bucket without le", s.line, s.name)
    try:
        return parse_float(le_str)
    except ValueError:
        raise ExpositionError(f"bad le {le_str!r}", s.line, s.name) from None


def _kept_labels(
    kind: str, canon: str, labels: dict[str, str], identity: tuple[str, ...]
) -> Labels:
    """An info series keeps every label but the identity; the others their breakdown's."""
    if kind == "info":
        return tuple(sorted((k, v) for k, v in labels.items() if k not in identity))
    breakdown = FAMILY_BREAKDOWNS.get(canon, BREAKDOWN_LABELS)
    return tuple(sorted((k, v) for k, v in labels.items() if k in breakdown))


def classify(
    s: Sample,
    types: dict[str, str],
    counter_bases: set[str],
    identity: tuple[str, ...],
    keep: tuple[str, ...] | None,
    escaped: dict[str, str] | None = None,
) -> SeriesDraft | None:
    name = s.name
    family, suffix, typ = _family_of(name, types)
    if typ == "gauge" and name in counter_bases and name.startswith("ray_"):
        return None  # Ray OpenCensus exports counters twice; count the `_total` one only
    labels = dict(s.labels)
    # only a histogram's buckets read `le`: every other type keeps it as a breakdown label
    le_str = labels.pop("le", None) if typ == "histogram" else None
    base, kind = _base_and_kind(name, typ, family, suffix)
    base = _unprefixed(base, escaped)
    canon, renamed = canonical_family(base)
    original = base if canon != base else None
    if keep is not None and not canon.startswith(keep):
        return None
    le = _bucket_bound(le_str, s) if kind == "bucket" else None
    kept = _kept_labels(kind, canon, labels, identity)
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
    key = (
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
    hist_parts: dict[tuple[str, Labels], dict] = {}
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
            part = hist_parts.setdefault((d.family, d.labels), {"b": []})
            if d.kind == "bucket":
                part["b"].append((d.le, slot))
            else:
                part[d.kind] = slot
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
