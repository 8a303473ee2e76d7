"""Per-engine, per-series deltas between two scrapes, with Prometheus reset semantics.

Rules (docs/rules.md §3.1-3.3), all per engine and per series:

* delta = current - baseline, with the engine's own time difference;
* a series whose value decreased or whose ``_created`` moved was reset: its delta is its new
  value (it restarted from 0), exactly like PromQL's ``increase()``;
* an engine whose *process* restarted (``process_start_time_seconds`` moved, most of its
  ``_created`` values moved, or — without any start-time evidence — most of its counters
  dropped) counts **every** series from 0, because some series grow past their old values
  before the next scrape and a decrease-only rule misses them;
* a series that first appears in an engine already observed, with no restart in between,
  started from 0 after the previous scrape: its whole value is the delta;
* a histogram bucket absent from the baseline counts from 0 only if the baseline ``_count`` was
  0; otherwise its delta is unknown (NaN) and quantiles pool the remaining bounds.

Pure functions: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fleetscope.snapshot import EngineLayout, EngineSnapshot

# moved `_created` / dropped counters needed, as a share of the evidence, to call it a restart
RESTART_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class EngineDelta:
    """What one engine did between its baseline and its current scrape.

    ``delta`` is aligned with ``current.layout``: the increase of every cumulative slot
    (counters, buckets, ``_sum``, ``_count``), NaN where unknown (no baseline yet, gauges,
    ``_created``). ``seconds`` is 0 for a baseline-only observation.
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

    @property
    def layout(self) -> EngineLayout:
        return self.current.layout


_ALIGN_CACHE: dict[tuple[EngineLayout, EngineLayout], np.ndarray] = {}


def _alignment(prev: EngineLayout, cur: EngineLayout) -> np.ndarray:
    """For every slot of ``cur``, the slot of the same series in ``prev``, or -1."""
    key = (prev, cur)
    idx = _ALIGN_CACHE.get(key)
    if idx is None:
        pindex = prev.index
        idx = np.array([pindex.get(sid, -1) for sid in cur.slot_ids], dtype=np.intp)
        if len(_ALIGN_CACHE) > 1024:
            _ALIGN_CACHE.clear()
        _ALIGN_CACHE[key] = idx
    return idx


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
    lay = current.layout
    cum = lay.cumulative
    d[cum] = current.data[cum]
    sums = [h.sum for h in lay.histograms if h.sum >= 0]
    if sums:
        d[sums] = current.data[sums]
    return d


def engine_delta(
    prev: EngineSnapshot,
    cur: EngineSnapshot,
    carried: Mapping[str, float] | None = None,
) -> EngineDelta:
    """Delta of one engine between its previous and current successful scrapes.

    ``carried``: last values of series that were missing from ``prev`` but seen earlier (so a
    series that blinks out for a scrape is not counted from 0 when it returns).
    """
    lay = cur.layout
    cdat = cur.data
    if prev.layout is lay:
        pdat = prev.data
        aligned = True
    else:
        idx = _alignment(prev.layout, lay)
        pdat = np.where(idx >= 0, prev.data[np.maximum(idx, 0)], np.nan)
        if carried:
            for i in np.flatnonzero(idx < 0):
                v = carried.get(lay.slot_ids[i])
                if v is not None:
                    pdat[i] = v
        aligned = False
    seconds = cur.time - prev.time
    d = cdat - pdat

    # ---- is this a process restart?
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
        pc, cc = pdat[cs], cdat[cs]
        known = ~np.isnan(pc)
        created_moved = (cc != pc) & known
        n_known = int(known.sum())
        if n_known and created_moved.sum() >= max(1.0, RESTART_SHARE * n_known):
            restarted = True
    cum = lay.cumulative
    dc = d[cum]
    dropped = dc < 0  # NaN compares False
    if not restarted and len(cs) == 0 and prev.process_start is None:
        grown_before = pdat[cum] > 0
        n_ev = int(grown_before.sum())
        if n_ev and dropped.sum() >= max(1.0, RESTART_SHARE * n_ev):
            restarted = True

    if restarted:
        out = _cumulative_values(cur)
        return EngineDelta(cur.engine, cur, out, seconds, restarted=True)

    out = np.full(len(cdat), np.nan)
    out[cum] = dc
    sums = [h.sum for h in lay.histograms if h.sum >= 0]
    if sums:
        out[sums] = d[sums]

    # ---- series resets: a dropped value or a moved `_created` resets its whole group
    series_reset = 0
    reset_groups: set[int] = set()
    if dropped.any():
        reset_groups.update(int(g) for g in lay.group_of_slot[cum[dropped]])
    if created_moved.any():
        reset_groups.update(int(g) for g in lay.group_of_slot[cs[created_moved]])
    reset_groups.discard(-1)
    for g in reset_groups:
        slots = lay.groups[g]
        out[slots] = cdat[slots]
        series_reset += 1
    # `_created` slots carry no increase
    if len(cs):
        out[cs] = np.nan

    # ---- series absent from the baseline
    series_new = 0
    if not aligned:
        new = np.isnan(pdat)
        if new.any():
            for c in lay.counters:
                if new[c.slot]:
                    out[c.slot] = cdat[c.slot]
                    series_new += 1
            for h in lay.histograms:
                missing = [s for s in h.buckets if new[s]]
                if not missing and (h.count < 0 or not new[h.count]):
                    continue
                series_new += 1
                if h.count >= 0 and new[h.count]:  # the whole child is new: counts from 0
                    for s in (*h.buckets, h.count, h.sum):
                        if s >= 0:
                            out[s] = cdat[s]
                    continue
                base_count = pdat[h.count] if h.count >= 0 else np.nan
                fill = cdat if base_count == 0 else None
                for s in missing:
                    out[s] = fill[s] if fill is not None else np.nan
    return EngineDelta(
        cur.engine,
        cur,
        out,
        seconds,
        series_reset=series_reset,
        series_new=series_new,
    )


class Baselines:
    """The last successful snapshot of every engine, plus series that went missing.

    Pure bookkeeping for a poller: :meth:`advance` turns a new snapshot into an
    :class:`EngineDelta` and makes it the new baseline. Engines not seen in a poll keep their
    baseline, so the next success gives exact deltas over the longer interval.
    """

    def __init__(self) -> None:
        self._last: dict[str, EngineSnapshot] = {}
        self._carried: dict[str, dict[str, float]] = {}

    def __contains__(self, engine_id: str) -> bool:
        return engine_id in self._last

    def __len__(self) -> int:
        return len(self._last)

    def get(self, engine_id: str) -> EngineSnapshot | None:
        return self._last.get(engine_id)

    def advance(
        self,
        engine_id: str,
        cur: EngineSnapshot,
        *,
        new_engine_interval: float | None = None,
    ) -> EngineDelta:
        """Delta against the engine's baseline; ``cur`` becomes the baseline.

        ``new_engine_interval``: for an engine never seen before, the seconds since the previous
        poll when its start time proves it started after that poll (its values all count);
        None means its first values are only a baseline.
        """
        prev = self._last.get(engine_id)
        if prev is None:
            delta = (
                baseline(cur)
                if new_engine_interval is None
                else from_zero(cur, new_engine_interval)
            )
        else:
            delta = engine_delta(prev, cur, self._carried.get(engine_id))
            if delta.restarted:
                self._carried.pop(engine_id, None)
            elif prev.layout is not cur.layout:
                self._carry_missing(engine_id, prev, cur)
        self._last[engine_id] = cur
        return delta

    def _carry_missing(self, engine_id: str, prev: EngineSnapshot, cur: EngineSnapshot) -> None:
        cur_index = cur.layout.index
        carried = self._carried.setdefault(engine_id, {})
        cum = set(prev.layout.cumulative.tolist()) | set(prev.layout.created_slots.tolist())
        for i, sid in enumerate(prev.layout.slot_ids):
            if sid not in cur_index and i in cum:
                carried[sid] = float(prev.data[i])
        for sid in list(carried):
            if sid in cur_index:
                del carried[sid]

    def forget(self, engine_id: str) -> None:
        self._last.pop(engine_id, None)
        self._carried.pop(engine_id, None)

    def engines(self) -> list[str]:
        return list(self._last)

    def last(self, engine_id: str) -> EngineSnapshot | None:
        """The engine's latest snapshot (its baseline for the next poll), if any."""
        return self._last.get(engine_id)

    def state(self) -> dict[str, EngineSnapshot]:
        return dict(self._last)
