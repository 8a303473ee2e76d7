"""The last successful snapshot of every engine, and the deltas each new scrape makes.

``Baselines.advance`` is the rule for one engine (``stats/deltas.py``); ``advance_many`` gives
the same deltas for a whole poll at once: engines that share a layout with their baseline and
show no reset (nearly all of them, every poll) are computed as one matrix, the rest one by
one. Pure bookkeeping: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from fleetscope.exposition.snapshot import EngineLayout, EngineSnapshot
from fleetscope.identity import EngineId
from fleetscope.stats.deltas import EngineDelta, baseline, engine_delta, from_zero

# below this many engines of one layout the matrix costs more than it saves
BATCH_MIN = 4


class Advance(NamedTuple):
    """One engine's new snapshot, with the arguments of :meth:`Baselines.advance`."""

    engine_id: str
    snapshot: EngineSnapshot
    new_engine_interval: float | None = None
    continuity_unknown: bool = False


class Baselines:
    """The last successful snapshot of every engine, plus series that went missing.

    Pure bookkeeping for a poller: :meth:`advance` turns a new snapshot into an
    :class:`EngineDelta` and makes it the new baseline. Engines not seen in a poll keep their
    baseline, so the next success gives exact deltas over the longer interval. A series missing
    from a scrape (absent, or left out as invalid) keeps its last value and that value's time.
    """

    def __init__(self) -> None:
        self._last: dict[str, EngineSnapshot] = {}
        # engine -> series id -> (last value, its monotonic time); NaN value: never valid yet
        self._carried: dict[str, dict[str, tuple[float, float]]] = {}

    def __contains__(self, engine_id: str) -> bool:
        return engine_id in self._last

    def __len__(self) -> int:
        return len(self._last)

    def advance(
        self,
        engine_id: str,
        cur: EngineSnapshot,
        *,
        new_engine_interval: float | None = None,
        continuity_unknown: bool = False,
    ) -> EngineDelta:
        """Delta against the engine's baseline; ``cur`` becomes the baseline.

        ``new_engine_interval``: for an engine never seen before, the seconds since the previous
        poll when its start time proves it started after that poll (its values all count);
        None means its first values are only a baseline.
        ``continuity_unknown``: the caller cannot vouch that the engine was the same process all
        along (e.g. its connection was refused between two successes): deltas are computed as
        usual, but ``observed_seconds`` is 0 and the delta says ``continuity_unknown``.
        """
        prev = self._last.get(engine_id)
        if prev is None:
            delta = (
                baseline(cur)
                if new_engine_interval is None
                else from_zero(cur, new_engine_interval)
            )
        else:
            kept = self._carried.get(engine_id)
            values = {k: v for k, (v, _t) in kept.items()} if kept else None
            times = {k: t for k, (_v, t) in kept.items()} if kept else None
            delta = engine_delta(prev, cur, values, times)
            if delta.restarted:
                self._carried.pop(engine_id, None)
            elif prev.layout is not cur.layout:
                self._carry_missing(engine_id, prev, cur)
        if cur.invalid:
            carried = self._carried.setdefault(engine_id, {})
            for sid in cur.invalid:
                carried.setdefault(sid, (float("nan"), cur.time))
        if continuity_unknown and prev is not None:
            delta = replace(delta, observed_seconds=0.0, continuity_unknown=True)
        self._last[engine_id] = cur
        return delta

    def advance_many(self, items: Sequence[Advance]) -> list[EngineDelta]:
        """:meth:`advance` for every item, in order, with the same results. Engines whose
        baseline has the same layout, the same process start, no invalid series and no
        dropped counter or moved ``_created`` are computed together, one matrix per layout."""
        out: list[EngineDelta | None] = [None] * len(items)
        batches: dict[EngineLayout, list[int]] = {}
        seen: set[str] = set()
        for k, it in enumerate(items):
            prev = self._last.get(it.engine_id)
            cur = it.snapshot
            if (
                prev is not None
                and prev.layout is cur.layout
                and not cur.invalid
                and not it.continuity_unknown
                and it.engine_id not in seen
                and (
                    prev.process_start is None
                    or cur.process_start is None
                    or prev.process_start == cur.process_start
                )
            ):
                batches.setdefault(cur.layout, []).append(k)
            seen.add(it.engine_id)
        for lay, ks in batches.items():
            if len(ks) < BATCH_MIN:
                continue
            for k, d in zip(ks, self._batch(lay, [items[k] for k in ks]), strict=True):
                out[k] = d
        for k, it in enumerate(items):  # the rest, one by one, in order
            if out[k] is None:
                out[k] = self.advance(
                    it.engine_id,
                    it.snapshot,
                    new_engine_interval=it.new_engine_interval,
                    continuity_unknown=it.continuity_unknown,
                )
        return out  # type: ignore[return-value]

    def _batch(self, lay: EngineLayout, items: list[Advance]) -> list[EngineDelta | None]:
        """The clean engines of one layout as a matrix; None for the others (left to
        :meth:`advance`: a reset or a restart needs the per-engine rules)."""
        prevs = [self._last[it.engine_id] for it in items]
        prev = np.stack([p.data for p in prevs])
        cur = np.stack([it.snapshot.data for it in items])
        with np.errstate(over="ignore", invalid="ignore"):  # gauges may be infinite
            d = cur - prev
        cum = lay.cumulative
        bad = (d[:, cum] < 0).any(axis=1)  # a dropped value: a reset, or a restart
        cs = lay.created_slots
        if len(cs):
            pc, cc = prev[:, cs], cur[:, cs]
            bad |= ((cc != pc) & ~np.isnan(pc)).any(axis=1)  # a moved `_created`
        keep = lay.increase_slots
        res = np.full_like(d, np.nan)
        res[:, keep] = d[:, keep]
        out: list[EngineDelta | None] = []
        for i, it in enumerate(items):
            if bad[i]:
                out.append(None)
                continue
            snap = it.snapshot
            out.append(EngineDelta(snap.engine, snap, res[i], snap.time - prevs[i].time))
            self._last[it.engine_id] = snap
        return out

    def _carry_missing(self, engine_id: str, prev: EngineSnapshot, cur: EngineSnapshot) -> None:
        cur_index = cur.layout.index
        carried = self._carried.setdefault(engine_id, {})
        cum = set(prev.layout.cumulative.tolist()) | set(prev.layout.created_slots.tolist())
        for h in prev.layout.histograms:
            if h.sum >= 0:
                cum.add(h.sum)
        for i, sid in enumerate(prev.layout.slot_ids):
            if sid not in cur_index and i in cum:
                carried[sid] = (float(prev.data[i]), prev.time)
        for sid in list(carried):
            if sid in cur_index:
                del carried[sid]
        if not carried:
            del self._carried[engine_id]

    def forget(self, engine_id: str) -> None:
        self._last.pop(engine_id, None)
        self._carried.pop(engine_id, None)

    def engines(self) -> list[str]:
        return list(self._last)

    def last(self, engine_id: str) -> EngineSnapshot | None:
        """The engine's latest snapshot (its baseline for the next poll), if any."""
        return self._last.get(engine_id)


def share_restarts(
    rows: Sequence[tuple[EngineId, EngineSnapshot]], deltas: list[EngineDelta]
) -> list[EngineDelta]:
    """Rows of one endpoint without start times share a process (a DP server's engines and its
    own series): when one of them shows a restart, the others' intervals cannot be vouched for
    either (their counters may have grown past their old values), so they count as not
    observed."""
    restarted = {
        eid.endpoint
        for (eid, snap), d in zip(rows, deltas, strict=True)
        if d.restarted and not d.baseline_only and snap.start_time is None
    }
    if not restarted:
        return deltas
    return [
        replace(d, observed_seconds=0.0, continuity_unknown=True)
        if eid.endpoint in restarted
        and snap.start_time is None
        and not d.restarted
        and not d.baseline_only
        else d
        for (eid, snap), d in zip(rows, deltas, strict=True)
    ]
