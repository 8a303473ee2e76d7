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
from collections.abc import Iterable, Mapping, Sequence
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
    # per engine: polls and seconds in a row each streak condition held (see _streak)
    _waiting: dict[str, float] = field(default_factory=dict)  # last waiting queue
    _queue: dict[str, tuple[int, float]] = field(default_factory=dict)  # the queue grew
    _outlier: dict[str, tuple[int, float]] = field(default_factory=dict)  # below the median
    _stall: dict[str, tuple[int, float]] = field(default_factory=dict)  # without a token
    _kv: dict[str, tuple[int, float]] = field(default_factory=dict)  # at/above kv_full

    def forget_endpoint(self, endpoint: str) -> None:
        """An endpoint left the fleet: its engines' streaks end (back later, they start over)."""
        for streaks in (self._waiting, self._queue, self._outlier, self._stall, self._kv):
            for eid in [e for e in streaks if e.split(".", 1)[0] == endpoint]:
                del streaks[eid]

    def evaluate(self, result: PollReadings, roles: Mapping[str, str | None]) -> list[HealthEvent]:
        stats = result.stats
        events: list[HealthEvent] = []
        per_engine = stats.engine_values(_READ)
        by_role: dict[str | None, list[tuple[str, float, float]]] = {}
        seconds = dict(zip(stats.engine_ids, stats.seconds.tolist(), strict=True))
        for eid, m in per_engine.items():
            role = roles.get(eid)
            interval = seconds.get(eid, 0.0)  # 0 for a baseline-only first observation
            running = m.get(catalog.RUNNING)
            waiting = m.get(catalog.WAITING)
            gen = next((m[k] for k in catalog.DECODE_RATES if m.get(k) is not None), None)
            found = (
                self._generation_stalled(eid, role, running, gen, interval),
                self._kv_cache_near_full(eid, m.get(catalog.KV_USAGE), interval),
                self._queue_growing(eid, waiting, running, interval),
                self._preemption_burst(eid, m.get(catalog.PREEMPTION_RATE), interval),
            )
            events.extend(e for e in found if e is not None)
            # an engine with nothing to do generates nothing: idle, not an outlier (at the end
            # of a batch the engines that finished first wait for the stragglers)
            idle = running is not None and running == 0 and not (waiting or 0) > 0
            if interval > 0 and gen is not None and not idle:
                by_role.setdefault(role, []).append((eid, gen, interval))
            elif idle:
                self._outlier.pop(eid, None)
        for role, rows in by_role.items():
            events.extend(self._engine_outliers(role, rows))
        events.extend(_scrape_failed(result.scrapes))
        return events

    def _generation_stalled(
        self,
        eid: str,
        role: str | None,
        running: float | None,
        gen: float | None,
        interval: float,
    ) -> HealthEvent | None:
        """Requests running and no token generated for ``stall_seconds`` (not prefill)."""
        if not interval > 0:
            return None  # a baseline: no interval to judge, the streak stands
        # two polls close together can both see no new token: judge over seconds
        no_token = role != "prefill" and running is not None and running > 0 and gen == 0
        _, stalled = _streak(self._stall, eid, no_token, interval)
        if no_token and stalled >= self.thresholds.stall_seconds:
            return HealthEvent(
                "generation_stalled",
                eid,
                running,
                f"{eid}: {running:.0f} requests running, no token for {stalled:.0f} s",
            )
        return None

    def _kv_cache_near_full(
        self, eid: str, kv: float | None, interval: float
    ) -> HealthEvent | None:
        """KV usage at or above ``kv_full`` for ``kv_polls`` polls and ``kv_seconds``."""
        if kv is None:
            return None
        t = self.thresholds
        polls, secs = _streak(self._kv, eid, kv >= t.kv_full, interval)
        if polls >= t.kv_polls and secs >= t.kv_seconds:
            return HealthEvent(
                "kv_cache_near_full",
                eid,
                kv,
                f"{eid}: KV cache {kv:.0%} full ({polls} polls, {secs:.0f} s in a row)",
            )
        return None

    def _queue_growing(
        self, eid: str, waiting: float | None, running: float | None, interval: float
    ) -> HealthEvent | None:
        """The waiting queue grew for ``queue_polls`` polls and ``queue_seconds`` in a row and
        exceeds the running batch."""
        if waiting is None:
            return None
        t = self.thresholds
        grew = waiting > self._waiting.get(eid, math.inf)
        self._waiting[eid] = waiting
        streak, secs = _streak(self._queue, eid, grew, interval)
        if streak >= t.queue_polls and secs >= t.queue_seconds and waiting > (running or 0):
            return HealthEvent(
                "queue_growing",
                eid,
                waiting,
                f"{eid}: waiting queue grew {streak} polls ({secs:.0f} s) in a row "
                f"to {waiting:.0f}",
            )
        return None

    def _preemption_burst(
        self, eid: str, rate: float | None, interval: float
    ) -> HealthEvent | None:
        """At least ``preemption_burst`` preemptions in one poll."""
        if rate is None or not interval > 0:
            return None
        burst = rate * interval
        if burst >= self.thresholds.preemption_burst:
            return HealthEvent(
                "preemption_burst", eid, burst, f"{eid}: {burst:.0f} preemptions in one poll"
            )
        return None

    def _engine_outliers(
        self, role: str | None, rows: list[tuple[str, float, float]]
    ) -> list[HealthEvent]:
        """Generation rate below ``outlier_fraction`` of the role's median in every poll for
        ``outlier_seconds`` (>= 3 engines with requests in the role, not prefill)."""
        t = self.thresholds
        med = statistics.median(v for _, v, _ in rows)
        if role == "prefill" or len(rows) < 3 or med < t.outlier_min_median:
            for eid, _, _ in rows:  # not judged this poll: a streak is "in a row" or nothing
                self._outlier.pop(eid, None)
            return []
        events = []
        for eid, v, interval in rows:
            below = v < t.outlier_fraction * med
            _, secs = _streak(self._outlier, eid, below, interval)
            if below and secs >= t.outlier_seconds:
                events.append(
                    HealthEvent(
                        "engine_outlier",
                        eid,
                        v,
                        f"{eid}: {v:.1f} tok/s, far below its role's median "
                        f"{med:.1f} for {secs:.0f} s",
                    )
                )
        return events


def _streak(
    streaks: dict[str, tuple[int, float]], eid: str, holds: bool, seconds: float
) -> tuple[int, float]:
    """Polls and seconds in a row a condition held for ``eid``: one more poll of ``seconds``
    while it holds; (0, 0.0), the streak forgotten, as soon as it does not."""
    if not holds:
        streaks.pop(eid, None)
        return 0, 0.0
    polls, secs = streaks.get(eid, (0, 0.0))
    streaks[eid] = grown = (polls + 1, secs + seconds)
    return grown


def _scrape_failed(scrapes: Iterable[ScrapeResult]) -> list[HealthEvent]:
    """The endpoints that did not answer with a valid exposition."""
    return [
        HealthEvent("scrape_failed", sc.endpoint, None, f"{sc.endpoint}: {sc.error}")
        for sc in scrapes
        if not sc.ok
    ]


def health_keys(events: list[HealthEvent], prefix: str = "inference") -> dict[str, float]:
    """Per poll: how many engines are in each condition (0 when none, so charts show it)."""
    counts = dict.fromkeys(CONDITIONS, 0.0)
    for e in events:
        counts[e.condition] += 1
    return {f"{prefix}/health/{c}": v for c, v in counts.items()}
