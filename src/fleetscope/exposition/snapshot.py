"""Per-engine snapshots: the cumulative values of one engine at one scrape, as plain data.

A snapshot is a value array aligned with an immutable :class:`EngineLayout`. Layouts are shared
by every snapshot of the same shape (the same series in the same order), across engines and
across polls, so statistics can subtract whole arrays instead of walking dictionaries.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fleetscope.exposition.textformat import Labels, escape_label_value


def format_series(name: str, labels: Labels) -> str:
    """The id of a series: ``name`` or ``name{k="v",...}``, label values escaped as in the
    text format (backslash, double quote, line feed) so distinct series never share an id."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels) + "}"


@dataclass(frozen=True, slots=True)
class CounterSeries:
    """One counter child. ``name`` is the family's current name without ``_total``."""

    name: str
    labels: Labels
    slot: int
    created: int  # slot of its `_created` sample, or -1


@dataclass(frozen=True, slots=True)
class GaugeSeries:
    name: str
    labels: Labels
    slot: int


@dataclass(frozen=True, slots=True)
class HistogramSeries:
    """One histogram child: cumulative buckets (ascending ``le``), ``_sum``, ``_count``."""

    name: str
    labels: Labels
    bounds: tuple[float, ...]
    buckets: tuple[int, ...]  # slots aligned with bounds
    sum: int  # slot or -1
    count: int  # slot or -1
    created: int  # slot or -1


@dataclass(frozen=True, eq=False)
class EngineLayout:
    """The shape of one engine's exposition. Compared by identity: equal shape, same object."""

    slot_ids: tuple[str, ...]
    counters: tuple[CounterSeries, ...]
    gauges: tuple[GaugeSeries, ...]
    histograms: tuple[HistogramSeries, ...]
    # info-like gauges (`*_info`): family -> its labels, kept as strings
    info: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    model_name: str | None = None

    @cached_property
    def index(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.slot_ids)}

    @cached_property
    def cumulative(self) -> np.ndarray:
        """Slots that only grow (counters, buckets, counts) — reset evidence when they drop."""
        idx = [c.slot for c in self.counters]
        for h in self.histograms:
            idx.extend(h.buckets)
            if h.count >= 0:
                idx.append(h.count)
        return np.array(sorted(idx), dtype=np.intp)

    @cached_property
    def gauge_slots(self) -> np.ndarray:
        return np.array([g.slot for g in self.gauges], dtype=np.intp)

    @cached_property
    def increase_slots(self) -> np.ndarray:
        """Slots that carry an increase: the cumulative ones and every histogram ``_sum``."""
        sums = [h.sum for h in self.histograms if h.sum >= 0]
        return np.array(sorted({*self.cumulative.tolist(), *sums}), dtype=np.intp)

    @cached_property
    def created_pairs(self) -> np.ndarray:
        """(value slot, created slot) for every series with a `_created` sample."""
        pairs = [(c.slot, c.created) for c in self.counters if c.created >= 0]
        pairs += [(h.count, h.created) for h in self.histograms if h.created >= 0 and h.count >= 0]
        return np.array(pairs, dtype=np.intp).reshape(-1, 2)

    @cached_property
    def groups(self) -> tuple[np.ndarray, ...]:
        """Slots that reset together: one counter (+created), or one whole histogram child."""
        out: list[np.ndarray] = []
        for c in self.counters:
            out.append(np.array([c.slot] + ([c.created] if c.created >= 0 else []), np.intp))
        for h in self.histograms:
            slots = list(h.buckets) + [s for s in (h.sum, h.count, h.created) if s >= 0]
            out.append(np.array(slots, dtype=np.intp))
        return tuple(out)

    @cached_property
    def group_of_slot(self) -> np.ndarray:
        g = np.full(len(self.slot_ids), -1, dtype=np.intp)
        for i, slots in enumerate(self.groups):
            g[slots] = i
        return g

    @cached_property
    def group_names(self) -> tuple[str, ...]:
        """Per group (see :attr:`groups`): the counter child's id or the histogram child's."""
        names = [self.slot_ids[c.slot] for c in self.counters]
        names += [format_series(h.name, h.labels) for h in self.histograms]
        return tuple(names)

    @cached_property
    def slot_kinds(self) -> np.ndarray:
        """Per slot: 0 gauge/other, 1 counter, 2 `_created`, 3 bucket, 4 `_sum`, 5 `_count`."""
        k = np.zeros(len(self.slot_ids), dtype=np.int8)
        for c in self.counters:
            k[c.slot] = 1
            if c.created >= 0:
                k[c.created] = 2
        for h in self.histograms:
            k[list(h.buckets)] = 3
            for s, code in ((h.sum, 4), (h.count, 5), (h.created, 2)):
                if s >= 0:
                    k[s] = code
        return k

    @cached_property
    def created_slots(self) -> np.ndarray:
        s = [c.created for c in self.counters if c.created >= 0]
        s += [h.created for h in self.histograms if h.created >= 0]
        return np.array(sorted(s), dtype=np.intp)


@dataclass(frozen=True, eq=False)
class EngineSnapshot(Mapping[str, float]):
    """All cumulative values of one engine at one scrape.

    Behaves as a read-only mapping from series id (``vllm:num_requests_running``,
    ``vllm:request_success_total{finished_reason="length"}``,
    ``vllm:time_to_first_token_seconds_bucket{le="0.1"}``) to its value.
    """

    engine: str
    layout: EngineLayout
    data: np.ndarray  # values aligned with layout.slot_ids (NaN: a gauge that is missing)
    time: float  # monotonic seconds at which the response arrived
    wall_time: float  # Unix seconds at the same moment
    # the serving process' start (process_start_time_seconds), when exposed
    process_start: float | None = None
    # ids of the slots left out of this scrape because their series were invalid
    # (docs/rules.md §3.9): they exist, but their values are unknown
    invalid: frozenset[str] = frozenset()

    def __getitem__(self, series: str) -> float:
        return float(self.data[self.layout.index[series]])

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout.slot_ids)

    def __len__(self) -> int:
        return len(self.layout.slot_ids)

    @property
    def start_time(self) -> float | None:
        """Best evidence of when this engine's process started (Unix seconds), if any."""
        if self.process_start is not None:
            return self.process_start
        cs = self.layout.created_slots
        if len(cs):
            return float(self.data[cs].min())
        return None

    @property
    def info(self) -> Mapping[str, Mapping[str, str]]:
        return self.layout.info

    def value(self, name: str, **labels: str) -> float | None:
        """A series' value by family or sample name and labels, or None when missing."""
        sid = format_series(name, tuple(sorted(labels.items())))
        i = self.layout.index.get(sid)
        return None if i is None else float(self.data[i])


_SUB_LAYOUTS: dict[
    tuple[EngineLayout, tuple[int, ...]], tuple[EngineLayout, np.ndarray, frozenset[str]]
] = {}


def without_groups(
    layout: EngineLayout, groups: tuple[int, ...]
) -> tuple[EngineLayout, np.ndarray, frozenset[str]]:
    """``layout`` without some of its :attr:`EngineLayout.groups` (invalid series): the smaller
    layout (one object per (layout, groups)), the kept slots, and the removed slot ids."""
    key = (layout, groups)
    hit = _SUB_LAYOUTS.get(key)
    if hit is not None:
        return hit
    drop: set[int] = set()
    for g in groups:
        drop.update(layout.groups[g].tolist())
    n = len(layout.slot_ids)
    keep = np.array([i for i in range(n) if i not in drop], dtype=np.intp)
    new_of = np.full(n, -1, dtype=np.intp)
    new_of[keep] = np.arange(len(keep))

    def m(s: int) -> int:
        return int(new_of[s]) if s >= 0 else -1

    gset = set(groups)
    nc = len(layout.counters)
    sub = EngineLayout(
        slot_ids=tuple(layout.slot_ids[i] for i in keep.tolist()),
        counters=tuple(
            CounterSeries(c.name, c.labels, m(c.slot), m(c.created))
            for i, c in enumerate(layout.counters)
            if i not in gset
        ),
        gauges=tuple(GaugeSeries(g.name, g.labels, m(g.slot)) for g in layout.gauges),
        histograms=tuple(
            HistogramSeries(
                h.name,
                h.labels,
                h.bounds,
                tuple(m(s) for s in h.buckets),
                m(h.sum),
                m(h.count),
                m(h.created),
            )
            for j, h in enumerate(layout.histograms)
            if nc + j not in gset
        ),
        info=layout.info,
        model_name=layout.model_name,
    )
    removed = frozenset(layout.slot_ids[i] for i in sorted(drop))
    if len(_SUB_LAYOUTS) > 1024:
        _SUB_LAYOUTS.clear()
    out = (sub, keep, removed)
    _SUB_LAYOUTS[key] = out
    return out
