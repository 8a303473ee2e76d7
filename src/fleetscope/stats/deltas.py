"""Per-engine, per-series deltas between two scrapes, with Prometheus reset semantics.

Rules (docs/rules.md §3.1-3.3), all per engine and per series:

* delta = current - baseline, with the engine's own time difference;
* a series whose value decreased or whose ``_created`` moved was reset: its delta is its new
  value (it restarted from 0), exactly like PromQL's ``increase()``;
* an engine whose *process* restarted (``process_start_time_seconds`` moved, most of its
  ``_created`` values moved, or — without any start-time evidence — most of its counters
  dropped, or two of its core counters (prompt / generation tokens, finished requests) dropped)
  counts **every** series from 0, because some series grow past their old values
  before the next scrape and a decrease-only rule misses them;
* a series that first appears in an engine already observed, with no restart in between,
  started from 0 after the previous scrape: its whole value is the delta — unless its
  ``_created`` proves it existed before the previous scrape (then it is only a baseline);
* a slot whose kind changed (a family whose TYPE flipped) gets no delta: a fresh baseline;
* a series that missed scrapes is compared with its last seen value, and its rate uses the
  interval the increase spans (:attr:`EngineDelta.span`);
* a histogram bucket absent from the baseline counts from 0 only if the baseline ``_count`` was
  0; otherwise its delta is unknown (NaN) and quantiles pool the remaining bounds.

Pure functions: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fleetscope import catalog
from fleetscope.exposition.snapshot import EngineLayout, EngineSnapshot

# moved `_created` / dropped counters needed, as a share of the evidence, to call it a restart
RESTART_SHARE = 0.5
# allowed disagreement (seconds) between the engine's clock and ours when `_created` values are
# compared with our wall time (the same default as fleet.DEFAULT_CLOCK_SKEW)
CLOCK_SKEW = 1.0
# counters an engine bumps on every request: two of them dropping is a restart, not two resets
# (docs/bad-data.md "Restarts without start-time evidence")
CORE_COUNTERS = frozenset(
    "vllm:" + name.removesuffix("_total")
    for name in (catalog.PROMPT_TOKENS, catalog.GENERATION_TOKENS, catalog.REQUEST_SUCCESS)
)


@dataclass(frozen=True, slots=True)
class EngineDelta:
    """What one engine did between its baseline and its current scrape.

    ``delta`` is aligned with ``current.layout``: the increase of every cumulative slot
    (counters, buckets, ``_sum``, ``_count``), NaN where unknown (no baseline yet, gauges,
    ``_created``). ``seconds`` is 0 for a baseline-only observation.

    ``span``: per slot, the seconds the slot's increase spans (longer than ``seconds`` for a
    series compared with a value carried from an earlier scrape); None = all equal ``seconds``.
    ``observed_seconds``: the part of ``seconds`` whose counts were really observed (==
    ``seconds`` normally; after a restart only the new process' life when known, else 0; 0 when
    the caller says continuity is unknown). ``tail_unseen``: counts made between the baseline
    and a reset (of the process or of a series) were lost. ``type_changed``: series ids whose
    kind changed since the baseline (no delta). docs/bad-data.md has the contract.
    """

    engine: str
    current: EngineSnapshot
    delta: np.ndarray
    seconds: float
    baseline_only: bool = False
    restarted: bool = False  # the process restarted since the baseline: all counted from 0
    started: bool = False  # a new engine that started inside the interval: all counted
    series_reset: int = 0
    series_new: int = 0
    span: np.ndarray | None = None
    observed_seconds: float = -1.0  # -1: the default, read as ``seconds`` (see __post_init__)
    tail_unseen: bool = False
    continuity_unknown: bool = False
    type_changed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.observed_seconds < 0:
            object.__setattr__(self, "observed_seconds", float(self.seconds))

    @property
    def layout(self) -> EngineLayout:
        return self.current.layout


_ALIGN_CACHE: dict[tuple[EngineLayout, EngineLayout], tuple[np.ndarray, np.ndarray]] = {}


def alignment(prev: EngineLayout, cur: EngineLayout) -> tuple[np.ndarray, np.ndarray]:
    """For every slot of ``cur``, the slot of the same series *of the same kind* in ``prev``, or
    -1; and the slots of ``cur`` whose id was in ``prev`` with another kind (a type flip)."""
    key = (prev, cur)
    hit = _ALIGN_CACHE.get(key)
    if hit is None:
        pindex = prev.index
        idx = np.array([pindex.get(sid, -1) for sid in cur.slot_ids], dtype=np.intp)
        pk, ck = prev.slot_kinds, cur.slot_kinds
        changed = (idx >= 0) & (pk[np.maximum(idx, 0)] != ck)
        # a counter that was a gauge family of the same name (`x` gauge -> `x_total` counter)
        pgauges = {(g.name, g.labels) for g in prev.gauges}
        for c in cur.counters:
            if idx[c.slot] < 0 and (c.name, c.labels) in pgauges:
                changed[c.slot] = True
        idx = np.where(changed, -1, idx)
        if len(_ALIGN_CACHE) > 1024:
            _ALIGN_CACHE.clear()
        hit = _ALIGN_CACHE[key] = (idx, changed)
    return hit


def baseline(current: EngineSnapshot) -> EngineDelta:
    """The first observation of an engine: values, no deltas."""
    nan = np.full(len(current.data), np.nan)
    return EngineDelta(current.engine, current, nan, 0.0, baseline_only=True)


def from_zero(current: EngineSnapshot, seconds: float) -> EngineDelta:
    """An engine proven to have started inside the interval: everything it counted is new."""
    d = _cumulative_values(current)
    return EngineDelta(current.engine, current, d, seconds, started=True)


def _cumulative_values(current: EngineSnapshot) -> np.ndarray:
    d = np.full(len(current.data), np.nan)
    keep = current.layout.increase_slots
    d[keep] = current.data[keep]
    return d


def _observed_after_restart(cur: EngineSnapshot, seconds: float) -> float:
    """The new process' life inside the interval, when its start time is known; else 0."""
    start = cur.start_time
    if start is None or not np.isfinite(start):
        return 0.0
    return float(min(max(cur.wall_time - start, 0.0), seconds))


def _carry_forward(
    cur: EngineSnapshot,
    seconds: float,
    pdat: np.ndarray,
    missing: list[int],
    carried: Mapping[str, float],
    carried_time: Mapping[str, float] | None,
    unknown: np.ndarray | None,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Fill ``pdat``'s ``missing`` slots with the values carried from earlier scrapes; returns
    the per-slot spans (None: all ``seconds``) and the slots known to be unknown (NaN carried)."""
    lay = cur.layout
    span: np.ndarray | None = None
    for i in missing:
        sid = lay.slot_ids[i]
        v = carried.get(sid)
        if v is None:
            continue
        if v != v:  # NaN: existed, value unknown
            if unknown is None:
                unknown = np.zeros(len(cur.data), dtype=bool)
            unknown[i] = True
            continue
        pdat[i] = v
        t = carried_time.get(sid) if carried_time else None
        if t is not None and cur.time - t != seconds:
            if span is None:
                span = np.full(len(cur.data), float(seconds))
            span[i] = cur.time - t
    return span, unknown


def _realigned_baseline(
    prev: EngineSnapshot,
    cur: EngineSnapshot,
    seconds: float,
    carried: Mapping[str, float] | None,
    carried_time: Mapping[str, float] | None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, tuple[str, ...]]:
    """The baseline of a layout that changed, in ``cur``'s slots: its values (NaN: none), the
    per-slot spans, the slots whose baseline is known to be unknown, the series whose type
    changed."""
    lay = cur.layout
    unknown: np.ndarray | None = None
    type_changed: tuple[str, ...] = ()
    idx, changed = alignment(prev.layout, lay)
    pdat = np.where(idx >= 0, prev.data[np.maximum(idx, 0)], np.nan)
    if changed.any():
        unknown = changed.copy()
        type_changed = tuple(lay.slot_ids[i] for i in np.flatnonzero(changed).tolist())
    span = None
    if carried:
        missing = np.flatnonzero((idx < 0) & ~changed).tolist()
        span, unknown = _carry_forward(cur, seconds, pdat, missing, carried, carried_time, unknown)
    return pdat, span, unknown, type_changed


def _process_restarted(
    prev: EngineSnapshot, cur: EngineSnapshot, pdat: np.ndarray, d: np.ndarray
) -> tuple[bool, np.ndarray, np.ndarray]:
    """Whether the engine's process restarted (its start time or most of its ``_created``
    moved; without start-time evidence, its counters dropped); the ``_created`` slots that
    moved, and which cumulative slots dropped."""
    lay = cur.layout
    restarted = False
    if (
        prev.process_start is not None
        and cur.process_start is not None
        and cur.process_start != prev.process_start
    ):
        restarted = True
    created_moved = np.zeros(0, dtype=bool)
    cs = lay.created_slots
    if not restarted and len(cs):
        pc, cc = pdat[cs], cur.data[cs]
        known = ~np.isnan(pc)
        created_moved = (cc != pc) & known
        n_known = int(known.sum())
        if n_known and created_moved.sum() >= max(1.0, RESTART_SHARE * n_known):
            restarted = True
    cum = lay.cumulative
    dropped = d[cum] < 0  # NaN compares False
    if not restarted and len(cs) == 0 and prev.process_start is None and dropped.any():
        restarted = _counters_dropped(lay, pdat, d, dropped)
    return restarted, created_moved, dropped


def _counters_dropped(
    lay: EngineLayout, pdat: np.ndarray, d: np.ndarray, dropped: np.ndarray
) -> bool:
    """No start-time evidence at all (multiprocess / DP bodies): counters must tell."""
    grown_before = pdat[lay.cumulative] > 0
    n_ev = int(grown_before.sum())
    if n_ev and dropped.sum() >= max(1.0, RESTART_SHARE * n_ev):
        return True
    core = {c.name for c in lay.counters if c.name in CORE_COUNTERS and d[c.slot] < 0}
    return len(core) >= 2


def _reset_series(
    lay: EngineLayout,
    cdat: np.ndarray,
    out: np.ndarray,
    dropped: np.ndarray,
    created_moved: np.ndarray,
) -> int:
    """A dropped value or a moved ``_created`` resets its whole group: its delta is its value.
    Fills ``out``; returns how many groups were reset."""
    series_reset = 0
    reset_groups: set[int] = set()
    if dropped.any():
        reset_groups.update(int(g) for g in lay.group_of_slot[lay.cumulative[dropped]])
    if created_moved.any():
        reset_groups.update(int(g) for g in lay.group_of_slot[lay.created_slots[created_moved]])
    reset_groups.discard(-1)
    for g in reset_groups:
        slots = lay.groups[g]
        out[slots] = cdat[slots]
        series_reset += 1
    return series_reset


def engine_delta(
    prev: EngineSnapshot,
    cur: EngineSnapshot,
    carried: Mapping[str, float] | None = None,
    carried_time: Mapping[str, float] | None = None,
    *,
    clock_skew: float = CLOCK_SKEW,
) -> EngineDelta:
    """Delta of one engine between its previous and current successful scrapes.

    ``carried``: last values of series that were missing from ``prev`` but seen earlier (so a
    series that blinks out for a scrape is not counted from 0 when it returns); NaN = a series
    that existed but whose value was invalid (its delta is unknown, never counted whole).
    ``carried_time``: the monotonic time of each carried value (for :attr:`EngineDelta.span`).
    """
    lay = cur.layout
    cdat = cur.data
    seconds = cur.time - prev.time
    span: np.ndarray | None = None
    unknown: np.ndarray | None = None  # slots whose baseline is known to be unknown
    type_changed: tuple[str, ...] = ()
    if prev.layout is lay:
        pdat = prev.data
        aligned = True
    else:
        pdat, span, unknown, type_changed = _realigned_baseline(
            prev, cur, seconds, carried, carried_time
        )
        aligned = False
    with np.errstate(over="ignore", invalid="ignore"):  # gauges may be infinite (not checked)
        d = cdat - pdat

    # ---- is this a process restart?
    restarted, created_moved, dropped = _process_restarted(prev, cur, pdat, d)
    if restarted:
        out = _cumulative_values(cur)
        return EngineDelta(
            cur.engine,
            cur,
            out,
            seconds,
            restarted=True,
            observed_seconds=_observed_after_restart(cur, seconds),
            tail_unseen=True,
            type_changed=type_changed,
        )

    out = np.full(len(cdat), np.nan)
    keep = lay.increase_slots  # the cumulative slots and every `_sum`
    out[keep] = d[keep]

    # ---- series resets: a dropped value or a moved `_created` resets its whole group
    series_reset = _reset_series(lay, cdat, out, dropped, created_moved)
    # `_created` slots carry no increase
    cs = lay.created_slots
    if len(cs):
        out[cs] = np.nan

    # ---- series absent from the baseline
    series_new = 0
    if not aligned:
        new = np.isnan(pdat)
        if unknown is not None:
            new &= ~unknown
        if new.any():
            series_new = _count_new(lay, cdat, pdat, new, out, prev.wall_time - clock_skew)
        if unknown is not None:
            out[unknown] = np.nan
    return EngineDelta(
        cur.engine,
        cur,
        out,
        seconds,
        series_reset=series_reset,
        series_new=series_new,
        span=span,
        tail_unseen=series_reset > 0,
        type_changed=type_changed,
    )


def _count_new(
    lay: EngineLayout,
    cdat: np.ndarray,
    pdat: np.ndarray,
    new: np.ndarray,
    out: np.ndarray,
    before: float,
) -> int:
    """Fill ``out`` for series absent from the baseline (docs/rules.md §3.3); how many counted.

    A series whose ``_created`` is before ``before`` (the previous scrape, minus clock skew)
    existed then without being seen: it is only a baseline.
    """
    series_new = 0
    for c in lay.counters:
        if new[c.slot]:
            if c.created >= 0 and cdat[c.created] < before:
                out[c.slot] = np.nan
                continue
            out[c.slot] = cdat[c.slot]
            series_new += 1
    for h in lay.histograms:
        missing = [s for s in h.buckets if new[s]]
        if not missing and (h.count < 0 or not new[h.count]):
            continue
        if h.count >= 0 and new[h.count]:  # the whole child is new: counts from 0
            slots = [s for s in (*h.buckets, h.count, h.sum) if s >= 0]
            if h.created >= 0 and cdat[h.created] < before:
                out[slots] = np.nan
                continue
            series_new += 1
            out[slots] = cdat[slots]
            continue
        series_new += 1
        base_count = pdat[h.count] if h.count >= 0 else np.nan
        fill = cdat if base_count == 0 else None
        for s in missing:
            out[s] = fill[s] if fill is not None else np.nan
    return series_new
