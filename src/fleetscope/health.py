"""Fleet health signals: named conditions, each with the engine (or endpoint) that triggers it.

Evaluated on every poll's per-engine metrics, with thresholds you can set. Conditions:

* ``generation_stalled`` — requests running and no token generated for ``stall_seconds``
  (not prefill engines);
* ``kv_cache_near_full`` — KV usage at or above ``kv_full`` for ``kv_polls`` polls and
  ``kv_seconds`` in a row (one reading at 95-100 % is routine for a busy engine: vLLM packs the
  cache, then preempts);
* ``queue_growing`` — the waiting queue grew for ``queue_polls`` polls and ``queue_seconds`` in
  a row and exceeds the running batch;
* ``preemption_burst`` — at least ``preemption_burst`` preemptions in one poll;
* ``engine_outlier`` — generation rate below ``outlier_fraction`` of its role's median in
  every poll for ``outlier_seconds`` in a row (needs >= 3 engines in the role with requests; an
  idle engine — nothing running or waiting — is not judged);
* ``scrape_failed`` — the endpoint did not answer with a valid exposition;
* ``stale_version`` — the engine's endpoint still serves an older policy version
  ``stale_seconds`` after the trainer announced a newer one (judged by
  :mod:`fleetscope.rl.versions`, which knows the versions);
* ``engine_paused`` — the engine is paused or asleep for ``paused_seconds`` in a row while no
  weight sync is open, i.e. while the trainer thinks it is generating (judged by
  :mod:`fleetscope.rl.states`; the time inside a sync never counts).

The RL conditions (``stale_version``, ``engine_paused``) are docs/rl-lifecycle.md §3.

Pure logic with a little memory (streaks); the collector logs the counts as metrics
(``inference/health/{condition}``) and the events as rate-limited warnings and sink events.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from fleetscope import catalog

if TYPE_CHECKING:
    from fleetscope.sources.base import ScrapeResult
    from fleetscope.stats.reduce import PollStats

CONDITIONS: tuple[str, ...] = (
    "generation_stalled",
    "kv_cache_near_full",
    "queue_growing",
    "preemption_burst",
    "engine_outlier",
    "scrape_failed",
    "stale_version",
    "engine_paused",
)


class PollReadings(Protocol):
    """What the conditions read of one poll (a ``fleetscope.fleet.state.PollResult``)."""

    @property
    def stats(self) -> PollStats: ...

    @property
    def scrapes(self) -> Sequence[ScrapeResult]: ...


# the per-engine columns the conditions read
_READ = (
    catalog.RUNNING,
    *catalog.DECODE_RATES,
    catalog.KV_USAGE,
    catalog.WAITING,
    catalog.PREEMPTION_RATE,
)


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    kv_full: float = 0.95
    # Streaks need both a number of polls in a row and real seconds between scrapes, so a fast
    # poll interval does not turn a transient (a long prefill, a cold first request, a burst of
    # submissions, a CPU hiccup) into an alert; the defaults agree at the default 5 s interval.
    kv_polls: int = 2
    kv_seconds: float = 10.0
    queue_polls: int = 4
    queue_seconds: float = 20.0
    preemption_burst: float = 10.0
    outlier_fraction: float = 0.25
    outlier_seconds: float = 30.0  # below the fraction for this long, every poll in a row
    outlier_min_median: float = 1.0  # tokens/s: below this the role is simply idle
    stall_seconds: float = 30.0  # no token for this long while requests run (a 100k-token
    # prefill alone can take tens of seconds, and it counts no generated token until it ends)
    stale_seconds: float = 60.0  # on an older policy version this long after a newer one
    paused_seconds: float = 60.0  # paused or asleep this long while no weight sync is open


@dataclass(frozen=True, slots=True)
class HealthEvent:
    condition: str
    subject: str  # engine id, or endpoint name for scrape failures
    value: float | None
    message: str


@dataclass
class HealthMonitor:
    thresholds: HealthThresholds = field(default_factory=HealthThresholds)
    # last waiting, polls and seconds it grew in a row
    _queue: dict[str, tuple[float, int, float]] = field(default_factory=dict)
    _outlier: dict[str, float] = field(default_factory=dict)  # seconds below, in a row
    _stall: dict[str, float] = field(default_factory=dict)  # seconds without a token
    _kv: dict[str, tuple[int, float]] = field(default_factory=dict)  # polls, s at/above kv_full

    def evaluate(self, result: PollReadings, roles: Mapping[str, str | None]) -> list[HealthEvent]:
        t = self.thresholds
        stats = result.stats
        events: list[HealthEvent] = []
        per_engine = stats.engine_values(_READ)
        by_role: dict[str | None, list[tuple[str, float, float]]] = {}
        seconds = dict(zip(stats.engine_ids, stats.seconds.tolist(), strict=True))
        for eid, m in per_engine.items():
            role = roles.get(eid)
            interval = seconds.get(eid, 0.0)  # 0 for a baseline-only first observation
            fresh = interval > 0
            running = m.get(catalog.RUNNING)
            gen = next((m[k] for k in catalog.DECODE_RATES if m.get(k) is not None), None)
            if (
                fresh
                and role != "prefill"
                and running is not None
                and running > 0
                and gen is not None
                and gen == 0
            ):
                # two polls close together can both see no new token: judge over seconds
                stalled = self._stall.get(eid, 0.0) + interval
                self._stall[eid] = stalled
                if stalled >= t.stall_seconds:
                    events.append(
                        HealthEvent(
                            "generation_stalled",
                            eid,
                            running,
                            f"{eid}: {running:.0f} requests running, no token for {stalled:.0f} s",
                        )
                    )
            elif fresh:
                self._stall.pop(eid, None)
            kv = m.get(catalog.KV_USAGE)
            if kv is not None:
                polls, secs = self._kv.get(eid, (0, 0.0))
                polls, secs = (polls + 1, secs + interval) if kv >= t.kv_full else (0, 0.0)
                self._kv[eid] = (polls, secs)
                if polls >= t.kv_polls and secs >= t.kv_seconds:
                    events.append(
                        HealthEvent(
                            "kv_cache_near_full",
                            eid,
                            kv,
                            f"{eid}: KV cache {kv:.0%} full ({polls} polls, {secs:.0f} s in a row)",
                        )
                    )
            waiting = m.get(catalog.WAITING)
            if waiting is not None:
                last, streak, secs = self._queue.get(eid, (math.inf, 0, 0.0))
                streak, secs = (streak + 1, secs + interval) if waiting > last else (0, 0.0)
                self._queue[eid] = (waiting, streak, secs)
                if streak >= t.queue_polls and secs >= t.queue_seconds and waiting > (running or 0):
                    events.append(
                        HealthEvent(
                            "queue_growing",
                            eid,
                            waiting,
                            f"{eid}: waiting queue grew {streak} polls ({secs:.0f} s) in a row "
                            f"to {waiting:.0f}",
                        )
                    )
            pre = m.get(catalog.PREEMPTION_RATE)
            if pre is not None and fresh:
                burst = pre * interval
                if burst >= t.preemption_burst:
                    events.append(
                        HealthEvent(
                            "preemption_burst",
                            eid,
                            burst,
                            f"{eid}: {burst:.0f} preemptions in one poll",
                        )
                    )
            # an engine with nothing to do generates nothing: idle, not an outlier (at the end
            # of a batch the engines that finished first wait for the stragglers)
            idle = running is not None and running == 0 and not (waiting or 0) > 0
            if fresh and gen is not None and not idle:
                by_role.setdefault(role, []).append((eid, gen, interval))
            elif idle:
                self._outlier.pop(eid, None)
        for role, rows in by_role.items():
            med = statistics.median(v for _, v, _ in rows)
            if role == "prefill" or len(rows) < 3 or med < t.outlier_min_median:
                for eid, _, _ in rows:  # not judged this poll: a streak is "in a row" or nothing
                    self._outlier.pop(eid, None)
                continue
            for eid, v, interval in rows:
                if v < t.outlier_fraction * med:
                    below = self._outlier.get(eid, 0.0) + interval
                    self._outlier[eid] = below
                    if below >= t.outlier_seconds:
                        events.append(
                            HealthEvent(
                                "engine_outlier",
                                eid,
                                v,
                                f"{eid}: {v:.1f} tok/s, far below its role's median "
                                f"{med:.1f} for {below:.0f} s",
                            )
                        )
                else:
                    self._outlier.pop(eid, None)
        for sc in result.scrapes:
            if not sc.ok:
                events.append(
                    HealthEvent("scrape_failed", sc.endpoint, None, f"{sc.endpoint}: {sc.error}")
                )
        return events


def health_keys(events: list[HealthEvent], prefix: str = "inference") -> dict[str, float]:
    """Per poll: how many engines are in each condition (0 when none, so charts show it)."""
    counts = dict.fromkeys(CONDITIONS, 0.0)
    for e in events:
        counts[e.condition] += 1
    return {f"{prefix}/health/{c}": v for c, v in counts.items()}
