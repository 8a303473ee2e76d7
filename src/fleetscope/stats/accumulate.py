"""Exact per-engine sums over a set of polls: the body of a window and of a run label.

Part of windows and the run summary (docs/rules.md §3.8): exact sums of per-engine deltas.

Every poll's per-engine deltas are *attributed*: to each active window, and to the run label
of each active window; deltas that arrive while no window is active go to the ``idle`` label,
so nothing is lost (tokens produced between two windows show up under ``idle``). The run's
``combined`` label receives every delta once: it is the exact total of the whole run.

A window's totals are exact for every engine and series it covers: a failed scrape only moves
that engine's delta to its next success (which still lands in the window if it is still open),
a reset only restarts that series from 0. Coverage (engine-seconds covered / expected) reports
what a failure cost. Rates divide by the window's *active* seconds (pauses excluded);
quantiles pool the window's bucket deltas; gauges get a time-weighted mean and a peak.

Pure bookkeeping: the collector supplies the clock readings and the polls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fleetscope.catalog import gauge_metric_name
from fleetscope.exposition.snapshot import EngineLayout, EngineSnapshot
from fleetscope.identity import EngineId, endpoint_of
from fleetscope.stats.deltas import EngineDelta
from fleetscope.stats.engine_sum import EngineSum, add_rows, add_sum, copy_engine_sum
from fleetscope.stats.persist import (
    engine_from_data,
    engine_id_json,
    engine_to_data,
    layout_from_data,
    layout_to_data,
)
from fleetscope.stats.reduce import EngineInput, PollStats, metric_name, plan_for, reduce_poll

__all__ = ["Accumulator", "layout_from_data", "layout_to_data"]


class Accumulator:
    """Exact per-engine sums over a set of polls (one window, or one label over the run)."""

    def __init__(self, label: str):
        self.label = label
        self.engines: dict[str, EngineSum] = {}  # keyed by EngineId
        self.active_seconds = 0.0
        self.polls = 0
        self.failed_scrapes = 0
        self.engine_restarts = 0
        self.restarts_unseen_tail = 0  # resets whose last counts before them were unseen
        # engine-seconds of endpoints polled that never answered: one engine each (the fewest
        # they can have), none covered (docs/bad-data.md §7). Pending per endpoint until its
        # first answer: lost then, unless its engines prove they started after its first try
        self.unseen_seconds = 0.0
        self.unseen_pending: dict[str, float] = {}
        # windows: engine-seconds each engine should have covered, from boundary to boundary
        self.expected: dict[str, float] = {}
        self._open: dict[str, float] | None = None
        self._open_default = 0.0
        # endpoints added or removed while the span is open: expected time starts at an added
        # endpoint's first scrape and ends at a removed one's last, not at the boundaries
        self._joined: dict[str, float] = {}
        self._left: set[str] = set()  # engines whose expected time is already counted
        # run labels: the engines of the latest poll, its earliest scrape, engines gone
        self._last_present: set[str] = set()
        self._last_poll_time = 0.0
        self.departed: set[str] = set()
        # a run label continued by a restarted isolation child: the engines it knew, each
        # unseen from the saved poll until the new child's first scrape of it
        self._gap_from = 0.0
        self._gap_pending: set[str] = set()

    def add(
        self,
        inputs: Iterable[EngineInput],
        *,
        failed_scrapes: int = 0,
        unseen: Mapping[str, float] | None = None,
        phases: Sequence[tuple[int, float, float] | None] | None = None,
    ) -> None:
        """One poll's deltas; ``unseen``: endpoints of the fleet that never answered, each with
        the seconds since its previous attempt (measured like an engine's interval, between its
        own scrape times); ``phases``: each input's class (:mod:`fleetscope.stats.breakdown`),
        summed where its delta is."""
        self.polls += 1
        self.failed_scrapes += failed_scrapes
        for endpoint, seconds in (unseen or {}).items():
            silent = self.unseen_pending.get(endpoint, 0.0)
            self.unseen_pending[endpoint] = silent + max(0.0, seconds)
        inputs = list(inputs)
        if inputs:
            self._last_present = {inp.engine_id for inp in inputs}
            self._last_poll_time = min(inp.delta.current.time for inp in inputs)
        # the sums of every engine of one layout are added as one matrix (see _add_rows)
        by_layout: dict[EngineLayout, list[tuple[EngineDelta, EngineSum]]] = {}
        pending: set[str] = set()
        for i, inp in enumerate(inputs):
            d = inp.delta
            if inp.engine_id in pending:  # the same engine twice: its first delta goes first
                for layout, rows in by_layout.items():
                    add_rows(layout, rows)
                by_layout, pending = {}, set()
            acc = self.engines.get(inp.engine_id)
            if acc is None:
                acc = self.engines[inp.engine_id] = EngineSum(
                    d.layout,
                    d.current,
                    np.zeros(len(d.current.data)),
                    role=inp.role,
                    groups=inp.groups,
                    is_engine=inp.is_engine,
                )
            else:
                acc.realign(d.layout)
                acc.current = d.current
                if inp.engine_id in self._gap_pending:
                    self._gap_pending.discard(inp.engine_id)
                    acc.spanned += max(0.0, d.current.time - self._gap_from)  # not covered
            if d.baseline_only:
                continue
            began = d.current.time - d.seconds
            if (
                self._open is not None
                and d.started
                and inp.is_engine
                and not self._new_process(inp.engine_id, began)
            ):
                continue  # its first counts began before the window: not the window's
            acc.covered += d.observed_seconds  # a restart's unseen tail is not covered
            acc.spanned += d.seconds
            if phases is not None and (ph := phases[i]) is not None:
                acc.add_phase(ph)
            # an endpoint's own row restarts with its engines: its tail is theirs, counted
            # once per engine (its own series' resets without a restart still count)
            if d.tail_unseen and (inp.is_engine or not d.restarted):
                self.restarts_unseen_tail += 1
            if d.restarted:
                acc.restarts += 1
                if inp.is_engine:  # an endpoint's own row restarts with its engines
                    self.engine_restarts += 1
            by_layout.setdefault(d.layout, []).append((d, acc))
            pending.add(inp.engine_id)
        for layout, rows in by_layout.items():
            add_rows(layout, rows)

    def endpoint_answers(self, endpoint: str, *, lost: bool) -> None:
        """An endpoint that never answered has answered: its silent time was ``lost``
        (its engines were running), or not (each proved it started after the endpoint's
        first try and counted from 0: nothing ran unseen, rules §3.10)."""
        seconds = self.unseen_pending.pop(endpoint, 0.0)
        if lost:
            self.unseen_seconds += seconds

    def _new_process(self, engine: str, began: float) -> bool:
        """A window sees an engine whose process started during its interval (a scale-up, a
        restarted Ray actor's new worker, a late starter): True if its counts since
        ``began`` are the window's. A process already seen in the window, or one that began
        in it, counts (nothing before it is expected of it); one that began before the
        window opened counted partly outside it, where no count can be placed in time: the
        window leaves them out and expects that engine from its opening (coverage says so)."""
        assert self._open is not None
        if engine in self._open:
            return True
        opened = self._span_start(engine)
        self._left.discard(engine)
        if began < opened:
            self._open[engine] = opened
            return False
        self._open[engine] = began
        return True

    def continue_after(self, saved_at: float) -> None:
        """The same run goes on from a state saved at ``saved_at`` (this machine's monotonic
        clock) by a process that died since: each engine known here is expected from then on,
        and its time until its next scrape was not observed (its new baseline)."""
        self._gap_from = saved_at
        self._gap_pending = {e for e, a in self.engines.items() if a.is_engine}

    def add_seconds(self, seconds: float) -> None:
        self.active_seconds += max(0.0, seconds)

    def merge(self, other: Accumulator) -> None:
        """Add another accumulator's sums (a finished window into its run label)."""
        self.polls += other.polls
        self.failed_scrapes += other.failed_scrapes
        self.engine_restarts += other.engine_restarts
        self.restarts_unseen_tail += other.restarts_unseen_tail
        self.unseen_seconds += other.unseen_seconds
        for endpoint, seconds in other.unseen_pending.items():
            self.unseen_pending[endpoint] = self.unseen_pending.get(endpoint, 0.0) + seconds
        self.active_seconds += other.active_seconds
        self.merge_engines(other)

    def merge_engines(self, other: Accumulator) -> None:
        """Add another accumulator's per-engine sums and expected seconds, not its polls or
        seconds (a shard's part of a window whose polls the driver counted)."""
        for e, v in other.expected.items():
            self.expected[e] = self.expected.get(e, 0.0) + v
        for eid, o in other.engines.items():
            acc = self.engines.get(eid)
            if acc is None:
                self.engines[eid] = copy_engine_sum(o)
            else:
                add_sum(acc, o)

    def evict(self, engine: str, into: str) -> None:
        """Fold an engine's sums into another row (``{endpoint}.evicted``): totals stay
        exact while the number of rows stays bounded whatever an endpoint's labels do."""
        o = self.engines.pop(engine, None)
        if o is None:
            return
        dst = self.engines.get(into)
        if dst is None:
            self.engines[into] = o
        else:
            add_sum(dst, o)
        if engine in self.expected:
            self.expected[into] = self.expected.get(into, 0.0) + self.expected.pop(engine)
        self._left.discard(engine)
        self._last_present.discard(engine)
        self.departed.add(into)
        if self._open is not None:
            self._open.pop(engine, None)

    # ------------------------------------------------------------------ results

    def open_span(self, now: float, times: Mapping[str, float]) -> None:
        """A window opens (start / resume): each engine's own scrape time at that boundary."""
        self._open = dict(times)
        self._open_default = now
        self._joined = {}
        self._left = set()

    def _span_start(self, engine: str) -> float:
        assert self._open is not None
        if engine in self._open:
            return self._open[engine]
        return self._joined.get(endpoint_of(engine), self._open_default)

    def endpoint_joins(self, endpoint: str, time: float) -> None:
        """An endpoint was added to the fleet, first scraped at ``time``."""
        if self._open is None:
            return
        self._joined[endpoint] = time
        for e in [e for e in self._left if endpoint_of(e) == endpoint]:
            self._left.discard(e)
            self._open.pop(e, None)

    def endpoint_leaves(self, endpoint: str, time: float) -> None:
        """An endpoint was removed from the fleet, last scraped at ``time``: its engines are
        expected up to there and no further."""
        if self._open is None:
            return
        for e in self._span_engines({}):
            if endpoint_of(e) == endpoint:
                self.engine_leaves(e, time)

    def engine_leaves(self, engine: str, time: float) -> None:
        """An engine is gone for good (a restarted Ray actor's old worker), last scraped at
        ``time``: expected up to there."""
        if self._open is None or engine in self._left:
            return
        self.expected[engine] = self.expected.get(engine, 0.0) + max(
            0.0, time - self._span_start(engine)
        )
        self._left.add(engine)

    def _span_engines(self, times: Mapping[str, float]) -> set[str]:
        assert self._open is not None
        engines = set(self._open) | set(times) | {e for e, a in self.engines.items() if a.is_engine}
        return engines - self._left

    def close_span(self, now: float, times: Mapping[str, float]) -> None:
        """A window closes (pause / stop): every engine should have been covered from its time
        at the opening boundary to its time at this one (the boundary's time if it did not
        answer, so a failed last scrape shows as missing coverage)."""
        if self._open is None:
            return
        for e in self._span_engines(times):
            end = times.get(e, now)
            self.expected[e] = self.expected.get(e, 0.0) + max(0.0, end - self._span_start(e))
        self._open = None
        self._joined = {}
        self._left = set()

    def coverage(self) -> float | None:
        """Engine-seconds with exact deltas / engine-seconds the interval should cover."""
        engines = {e: a for e, a in self.engines.items() if a.is_engine}
        if self.expected:
            want = sum(self.expected.values()) + self._unseen_total()
            got = sum(min(a.covered, self.expected.get(e, 0.0)) for e, a in engines.items())
            return None if want <= 0 else round(min(1.0, got / want), 12)
        # a run label: what the deltas spanned, plus the silence of engines absent from the
        # last poll (failed, or gone without a departure) and of endpoints never seen;
        # nothing lost means exactly 1.0
        want, got = self._unseen_total(), 0.0
        for e, a in engines.items():
            got += a.covered
            want += a.spanned
            if e not in self._last_present and e not in self.departed:
                want += max(0.0, self._last_poll_time - a.current.time)
        if want <= 0:
            return None
        return round(min(1.0, got / want), 12)

    def _unseen_total(self) -> float:
        return self.unseen_seconds + sum(self.unseen_pending.values())

    def stats(self, prefixes: Iterable[str] | None = None) -> PollStats | None:
        """Reduce the sums: totals (``delta``), rates over active seconds, pooled ratios and
        quantiles, and time-weighted gauges (the gauge columns hold each engine's
        time-weighted mean; ``peak`` is added per scope)."""
        if not self.engines:
            return None
        seconds = self.active_seconds
        inputs = []
        for eid, a in self.engines.items():
            data = a.current.data.copy()
            gslots = a.layout.gauge_slots
            if a.gauge_area is not None and a.gauge_seconds is not None and len(gslots):
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    tw = a.gauge_area[gslots] / a.gauge_seconds[gslots]
                data[gslots] = np.where(a.gauge_seconds[gslots] > 0, tw, data[gslots])
            snap = EngineSnapshot(eid, a.layout, data, a.current.time, a.current.wall_time)
            delta = EngineDelta(eid, snap, a.delta, seconds if seconds > 0 else a.covered)
            inputs.append(EngineInput(eid, delta, a.role, a.groups, a.is_engine))
        kw = {"prefixes": tuple(prefixes)} if prefixes else {}
        stats = reduce_poll(inputs, **kw)
        _add_peaks(stats, self)
        return stats

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able): each engine's layout, current values and sums by slot."""
        engines = []
        for eid, a in self.engines.items():
            engines.append(engine_to_data(eid, a))
        return {
            "label": self.label,
            "active_seconds": self.active_seconds,
            "polls": self.polls,
            "failed_scrapes": self.failed_scrapes,
            "engine_restarts": self.engine_restarts,
            "restarts_unseen_tail": self.restarts_unseen_tail,
            "unseen_seconds": self.unseen_seconds,
            "unseen_pending": dict(self.unseen_pending),
            "expected": [[engine_id_json(e), v] for e, v in self.expected.items()],
            "engines": engines,
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Accumulator:
        acc = cls(state["label"])
        acc.active_seconds = float(state["active_seconds"])
        acc.polls = int(state["polls"])
        acc.failed_scrapes = int(state["failed_scrapes"])
        acc.engine_restarts = int(state["engine_restarts"])
        acc.restarts_unseen_tail = int(state.get("restarts_unseen_tail", 0))
        acc.unseen_seconds = float(state.get("unseen_seconds", 0.0))
        acc.unseen_pending = {str(e): float(v) for e, v in state.get("unseen_pending", {}).items()}
        acc.expected = {EngineId.from_json(e): float(v) for e, v in state.get("expected", [])}
        for e in state["engines"]:
            eid, engine = engine_from_data(e)
            acc.engines[eid] = engine
        return acc


def _add_peaks(stats: PollStats, acc: Accumulator) -> None:
    """Per scope, each gauge's peak: the max over engines of their max over polls."""
    peaks: dict[str, dict[str, float]] = {}  # engine -> metric -> peak
    for eid, a in acc.engines.items():
        if a.gauge_peak is None:
            continue
        plan = plan_for(a.layout)
        # plan value columns of kind gauge map 1:1 onto gauge slots (or sums of them)
        per = {}
        for g in a.layout.gauges:
            name = gauge_metric_name(metric_name(g.name), g.labels)
            v = a.gauge_peak[g.slot]
            if not math.isnan(v) and name in plan.names:
                per[name] = float(v)
        peaks[eid] = per
    for scope, s in stats.scopes.items():
        members = _scope_members(stats, acc, scope)
        for eid in members:
            for name, v in peaks.get(eid, {}).items():
                m = s.metrics.setdefault(name, {})
                m["peak"] = max(m.get("peak", -math.inf), v)


def _scope_members(stats: PollStats, acc: Accumulator, scope: str) -> list[str]:
    if scope == "agg":
        return list(acc.engines)
    return [eid for eid, a in acc.engines.items() if a.role == scope or scope in a.groups]
