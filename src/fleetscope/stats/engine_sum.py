"""One engine's exact sums over a set of polls (the per-engine part of an accumulator)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fleetscope.exposition.snapshot import EngineLayout, EngineSnapshot
from fleetscope.identity import Role
from fleetscope.stats.deltas import EngineDelta

#: engine-seconds per class of :mod:`fleetscope.stats.breakdown` (idle, busy, saturated, paused,
#: syncing)
N_PHASES = 5
IDLE_PHASE = 0


def no_phases() -> list[float]:
    return [0.0] * N_PHASES


@dataclass
class EngineSum:
    layout: EngineLayout
    current: EngineSnapshot
    delta: np.ndarray  # summed per-slot increases (NaN: unknown for this window)
    covered: float = 0.0  # engine-seconds with deltas whose counts were observed
    spanned: float = 0.0  # engine-seconds the deltas spanned
    gauge_area: np.ndarray | None = None  # sum of value * seconds per slot (gauges)
    gauge_seconds: np.ndarray | None = None
    gauge_peak: np.ndarray | None = None
    role: Role | None = None
    groups: tuple[str, ...] = ()
    is_engine: bool = True
    restarts: int = 0
    # sums of series missing from the current layout, by slot id: (delta, gauge area, gauge
    # seconds, gauge peak). A series that blinks out (after a restart, multiprocess-mode gauges
    # and lazily created children are absent until first used) keeps what it summed so far
    # and gets it back when it returns.
    retired: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    phases: list[float] = field(default_factory=no_phases)  # engine-seconds per class

    def add_phase(self, phase: tuple[int, float, float]) -> None:
        """One interval's class: (class, its seconds, idle seconds beside them)."""
        k, seconds, idle = phase
        self.phases[k] += seconds
        if idle:
            self.phases[IDLE_PHASE] += idle

    def realign(self, layout: EngineLayout) -> None:
        """Carry sums over to a new layout of the same engine (series come and go)."""
        if layout is self.layout:
            return
        old = self.layout.index
        new = layout.index
        for sid, i in old.items():
            if sid not in new:
                self._retire(sid, i)
        idx = np.array([old.get(s, -1) for s in layout.slot_ids], dtype=np.intp)
        have = idx >= 0

        def move(arr: np.ndarray, fill: float) -> np.ndarray:
            out = np.full(len(layout.slot_ids), fill)
            out[have] = arr[idx[have]]
            return out

        self.delta = move(self.delta, 0.0)  # a new series had nothing before it appeared
        if self.gauge_area is not None:
            assert self.gauge_seconds is not None and self.gauge_peak is not None
            self.gauge_area = move(self.gauge_area, 0.0)
            self.gauge_seconds = move(self.gauge_seconds, 0.0)
            self.gauge_peak = move(self.gauge_peak, np.nan)
        self.layout = layout
        for sid in [sid for sid in self.retired if sid in new]:
            self._restore(sid, new[sid])

    def _retire(self, sid: str, i: int) -> None:
        def at(arr: np.ndarray | None, fill: float) -> float:
            return fill if arr is None else float(arr[i])

        vals = (
            at(self.delta, 0.0),
            at(self.gauge_area, 0.0),
            at(self.gauge_seconds, 0.0),
            at(self.gauge_peak, math.nan),
        )
        if vals[0] == 0 and vals[1] == 0 and vals[2] == 0 and math.isnan(vals[3]):
            return  # nothing summed: nothing to keep
        self.retired[sid] = combine_retired(self.retired.get(sid), vals)

    @np.errstate(over="ignore", invalid="ignore")  # past float64: inf, named by reduce
    def _restore(self, sid: str, j: int) -> None:
        d, area, secs, peak = self.retired.pop(sid)
        self.delta[j] += d
        if area or secs or not math.isnan(peak):
            if self.gauge_area is None:
                n = len(self.layout.slot_ids)
                self.gauge_area, self.gauge_seconds = np.zeros(n), np.zeros(n)
                self.gauge_peak = np.full(n, np.nan)
            assert self.gauge_seconds is not None and self.gauge_peak is not None
            self.gauge_area[j] += area
            self.gauge_seconds[j] += secs
            self.gauge_peak[j] = np.fmax(self.gauge_peak[j], peak)


def combine_retired(
    a: tuple[float, float, float, float] | None, b: tuple[float, float, float, float]
) -> tuple[float, float, float, float]:
    if a is None:
        return b
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], float(np.fmax(a[3], b[3])))


def copy_engine_sum(a: EngineSum) -> EngineSum:
    return EngineSum(
        a.layout,
        a.current,
        a.delta.copy(),
        covered=a.covered,
        spanned=a.spanned,
        gauge_area=None if a.gauge_area is None else a.gauge_area.copy(),
        gauge_seconds=None if a.gauge_seconds is None else a.gauge_seconds.copy(),
        gauge_peak=None if a.gauge_peak is None else a.gauge_peak.copy(),
        role=a.role,
        groups=a.groups,
        is_engine=a.is_engine,
        restarts=a.restarts,
        retired=dict(a.retired),
        phases=list(a.phases),
    )


# a sum past float64 is inf: reduce names it (stats/limits.py), numpy prints nothing
@np.errstate(over="ignore", invalid="ignore")
def add_sum(acc: EngineSum, o: EngineSum) -> None:
    """Add ``o``'s sums to ``acc`` (layouts realigned: series come and go)."""
    acc.realign(o.layout)
    acc.current = o.current
    o2 = copy_engine_sum(o)
    o2.realign(acc.layout)
    acc.delta = acc.delta + o2.delta
    acc.covered += o2.covered
    acc.spanned += o2.spanned
    acc.restarts += o2.restarts
    acc.phases = [x + y for x, y in zip(acc.phases, o.phases, strict=True)]
    for sid, vals in o2.retired.items():  # absent from both layouts
        acc.retired[sid] = combine_retired(acc.retired.get(sid), vals)
    if o2.gauge_area is not None:
        assert o2.gauge_seconds is not None and o2.gauge_peak is not None
        if acc.gauge_area is None or acc.gauge_seconds is None or acc.gauge_peak is None:
            acc.gauge_area = o2.gauge_area.copy()
            acc.gauge_seconds = o2.gauge_seconds.copy()
            acc.gauge_peak = o2.gauge_peak.copy()
        else:
            acc.gauge_area += o2.gauge_area
            acc.gauge_seconds += o2.gauge_seconds
            acc.gauge_peak = np.fmax(acc.gauge_peak, o2.gauge_peak)


# a sum past float64 is inf: reduce names it (stats/limits.py), numpy prints nothing
@np.errstate(over="ignore", invalid="ignore")
def add_rows(layout: EngineLayout, rows: list[tuple[EngineDelta, EngineSum]]) -> None:
    """Add one poll's deltas of engines of one layout to their sums. An unknown increase (a
    series invalid on its first scrape, a type change) adds nothing, and its engine's interval
    counts as not observed: the sums keep every known increase, coverage says what was not
    (docs/bad-data.md §7). Gauges add value x seconds, seconds and their peak where known."""
    inc = np.stack([d.delta for d, _ in rows])
    unknown = np.isnan(inc)
    lost = unknown[:, layout.cumulative].any(axis=1)
    inc[unknown] = 0.0
    for (d, acc), row, gone in zip(rows, inc, lost, strict=True):
        acc.delta = acc.delta + row
        if gone:
            acc.covered -= d.observed_seconds
    gslots = layout.gauge_slots
    if not len(gslots):
        return
    values = np.stack([d.current.data for d, _ in rows])[:, gslots]
    secs = np.array([d.seconds for d, _ in rows])[:, None]
    ok = ~np.isnan(values)
    area = np.where(ok, values * secs, 0.0)
    seconds = np.where(ok, secs, 0.0)
    n = len(layout.slot_ids)
    for i, (_, acc) in enumerate(rows):
        if acc.gauge_area is None or acc.gauge_seconds is None or acc.gauge_peak is None:
            acc.gauge_area, acc.gauge_seconds = np.zeros(n), np.zeros(n)
            acc.gauge_peak = np.full(n, np.nan)
        acc.gauge_area[gslots] += area[i]
        acc.gauge_seconds[gslots] += seconds[i]
        acc.gauge_peak[gslots] = np.fmax(acc.gauge_peak[gslots], values[i])
