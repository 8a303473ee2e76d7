"""Where the engines' time went (docs/rules.md §3.13): idle, busy, saturated, paused, syncing.

**One class per interval.** Each engine's interval between two successful scrapes (its own
``seconds``, the time-weighting of gauges in windows: docs/rules.md §3.8) is put in exactly one
class, judged at the interval's end scrape, first match wins:

1. ``syncing``: a weight sync was open over the interval (the caller says: from a sync's entry
   poll, exclusive, to its exit poll, inclusive);
2. ``paused``: the engine was paused or asleep at the end scrape (the caller says:
   docs/rl-lifecycle.md §5);
3. ``saturated``: KV-cache usage at or above ``kv_full`` at the end scrape, or preemptions
   counted in the interval, or requests waiting for capacity at both its start and end scrapes
   (a queue that lasted, not an arrival the next engine step admits);
4. ``busy``: requests running, or waiting for capacity, at the end scrape;
5. ``idle``: nothing running and nothing waiting for capacity at the end scrape; but when that
   was so at its start scrape too, the seconds its requests finished in it spent running
   (vLLM's ``request_inference_time_seconds``: requests shorter than the interval, which fell
   between the two scrapes) are ``busy``, at most the interval's.

"Waiting for capacity" is vLLM's ``num_requests_waiting_by_reason{reason="capacity"}`` where
the engine has it (requests ``deferred`` for remote KV are not the engine's work yet), else
``num_requests_waiting``. An interval with neither a running nor a waiting gauge, and neither
paused nor syncing, is left unclassified (the shares are of classified engine-seconds).

**The engine's own count.** An engine that counts its idle time itself (SGLang's
``scheduler_idle_seconds``) has its idle engine-seconds over a window or run label from that
count, capped at its seconds neither paused nor syncing; what is left of those is busy and
saturated, saturated at most as judged above (:func:`engine_phase_seconds`).

Per-poll work is :meth:`PhaseClassifier.classify` (a few reads per engine); the sums live in
each engine's :class:`~fleetscope.stats.engine_sum.EngineSum` (``phases``) and are reduced per
scope at a window's stop and in the run summary (:func:`scope_phase_seconds`), with a verdict
(:func:`verdict`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetscope import catalog
from fleetscope.exposition.snapshot import EngineLayout
from fleetscope.stats.deltas import EngineDelta
from fleetscope.stats.engine_sum import EngineSum
from fleetscope.stats.reduce import EngineInput

__all__ = [
    "BUSY",
    "IDLE",
    "PAUSED",
    "PHASES",
    "SATURATED",
    "SYNCING",
    "VERDICTS",
    "Phase",
    "PhaseClassifier",
    "VerdictThresholds",
    "bottleneck_role",
    "engine_phase_seconds",
    "scope_phase_seconds",
    "shares",
    "verdict",
]

PHASES: tuple[str, ...] = ("idle", "busy", "saturated", "paused", "syncing")
IDLE, BUSY, SATURATED, PAUSED, SYNCING = range(len(PHASES))
#: one engine's interval: (its class, its seconds in it, idle seconds beside them)
Phase = tuple[int, float, float]

_RUNNING = "vllm:" + catalog.RUNNING
_WAITING = "vllm:" + catalog.WAITING
_KV = "vllm:" + catalog.KV_USAGE
_SERVED = "vllm:" + catalog.INFERENCE_TIME
_CAPACITY = (("reason", "capacity"),)


@dataclass(frozen=True, slots=True)
class _Slots:
    """Where one layout keeps what the classes are judged on (-1: absent)."""

    running: int
    waiting: int
    kv: int
    preemptions: int
    idle_counter: int
    served: int  # the ``_sum`` of the requests' running seconds


_SLOTS: dict[int, tuple[EngineLayout, _Slots]] = {}


def _slots(layout: EngineLayout) -> _Slots:
    hit = _SLOTS.get(id(layout))
    if hit is not None and hit[0] is layout:
        return hit[1]
    gauges = {(g.name, g.labels): g.slot for g in layout.gauges}
    counters = {(c.name, c.labels): c.slot for c in layout.counters}
    waiting = gauges.get((catalog.WAITING_BY_REASON_FAMILY, _CAPACITY), -1)
    s = _Slots(
        running=gauges.get((_RUNNING, ()), -1),
        waiting=waiting if waiting >= 0 else gauges.get((_WAITING, ()), -1),
        kv=gauges.get((_KV, ()), -1),
        preemptions=counters.get((catalog.PREEMPTIONS_FAMILY, ()), -1),
        idle_counter=counters.get((catalog.SCHEDULER_IDLE_FAMILY, ()), -1),
        served=next((h.sum for h in layout.histograms if h.name == _SERVED and not h.labels), -1),
    )
    if len(_SLOTS) > 4096:
        _SLOTS.clear()
    _SLOTS[id(layout)] = (layout, s)
    return s


_QUEUED, _ACTIVE = 1, 2  # what an engine's last scrape showed: a queue; anything to do


class PhaseClassifier:
    """Puts each engine's interval of a poll in one class (the rules of this module's doc).

    Keeps two bits per engine between polls: whether requests were waiting for capacity at its
    last scrape (a queue at both ends of an interval is saturation), and whether it had anything
    running or waiting (an interval idle at both ends counts its short requests)."""

    def __init__(self, kv_full: float = 0.95) -> None:
        self.kv_full = kv_full
        self._last: dict[str, int] = {}

    def classify(
        self,
        inputs: Sequence[EngineInput],
        held: Sequence[bool] | None = None,
        *,
        syncing: bool = False,
    ) -> list[Phase | None]:
        """One poll's classes, aligned with ``inputs`` (None: an endpoint's own row, a
        baseline, an interval of 0 s, or nothing to judge it on). ``held``: per input, the
        engine was paused or asleep at its end scrape; ``syncing``: a weight sync was open over
        this poll's interval."""
        out: list[Phase | None] = []
        last = self._last
        for i, inp in enumerate(inputs):
            if not inp.is_engine:
                out.append(None)
                continue
            d = inp.delta
            data = d.current.data
            s = _slots(d.current.layout)
            running = float(data[s.running]) if s.running >= 0 else math.nan
            waiting = float(data[s.waiting]) if s.waiting >= 0 else math.nan
            was = last.get(inp.engine_id, _ACTIVE)  # unknown: it may have had work
            now = (_QUEUED if waiting > 0 else 0) | (_ACTIVE if waiting > 0 or running > 0 else 0)
            # no gauge to say (a multiprocess server before its first step): it may have work
            last[inp.engine_id] = _ACTIVE if running != running and waiting != waiting else now
            secs = float(d.seconds)
            if d.baseline_only or not secs > 0:
                out.append(None)
            elif syncing:
                out.append((SYNCING, secs, 0.0))
            elif held is not None and held[i]:
                out.append((PAUSED, secs, 0.0))
            elif running != running and waiting != waiting:
                out.append(None)  # nothing to judge it on
            else:
                out.append(self._judged(d, s, secs, now, was))
        if len(last) > 2 * len(inputs) + 64:  # engines gone for good: forget their bits
            seen = {inp.engine_id for inp in inputs}
            self._last = {e: b for e, b in last.items() if e in seen}
        return out

    def _judged(self, d: EngineDelta, s: _Slots, secs: float, now: int, was: int) -> Phase:
        """Saturated, busy or idle (rules 3 to 5)."""
        kv = float(d.current.data[s.kv]) if s.kv >= 0 else math.nan
        pre = float(d.delta[s.preemptions]) if s.preemptions >= 0 else math.nan
        if kv >= self.kv_full or pre > 0 or now & was & _QUEUED:
            return (SATURATED, secs, 0.0)
        if now:
            return (BUSY, secs, 0.0)
        served = float(d.delta[s.served]) if s.served >= 0 and not was else 0.0
        if served > 0:  # short requests between two scrapes that found nothing to do
            busy = min(served, secs)
            return (BUSY, busy, secs - busy)
        return (IDLE, secs, 0.0)


def engine_phase_seconds(es: EngineSum) -> list[float]:
    """One engine's engine-seconds per class over its sums, idle from its own count where it
    keeps one (SGLang's ``scheduler_idle_seconds``: see the module doc)."""
    p = list(es.phases)
    slot = _slots(es.layout).idle_counter
    if slot < 0:
        return p
    counted = float(es.delta[slot])
    if not counted >= 0:
        return p
    active = p[IDLE] + p[BUSY] + p[SATURATED]
    idle = min(counted, active)
    saturated = min(p[SATURATED], active - idle)
    p[IDLE], p[BUSY], p[SATURATED] = idle, max(0.0, active - idle - saturated), saturated
    return p


def scope_phase_seconds(
    engines: Mapping[str, EngineSum],
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Engine-seconds per class per scope (``agg``, each role, each group) and per engine, of
    the engines (not endpoint rows) with any classified time."""
    scopes: dict[str, list[float]] = {}
    per_engine: dict[str, list[float]] = {}
    for eid, es in engines.items():
        if not es.is_engine:
            continue
        p = engine_phase_seconds(es)
        if not sum(p) > 0:
            continue
        per_engine[eid] = p
        for scope in dict.fromkeys(("agg", es.role or "agg", *es.groups)):
            acc = scopes.setdefault(scope, [0.0] * len(PHASES))
            for k, v in enumerate(p):
                acc[k] += v
    return scopes, per_engine


def shares(seconds: Sequence[float]) -> list[float] | None:
    """Each class's share of the engine-seconds (they sum to 1), None when there are none."""
    total = math.fsum(seconds)
    if not total > 0:
        return None
    return [v / total for v in seconds]


@dataclass(frozen=True, slots=True)
class VerdictThresholds:
    """The share of engine-seconds at or above which a class is a candidate bottleneck."""

    syncing: float = 0.2
    paused: float = 0.2
    saturated: float = 0.4
    idle: float = 0.5


#: class -> verdict name (the classes a verdict can name; ``balanced`` when none qualifies)
VERDICTS: dict[int, str] = {
    SYNCING: "weight_sync",
    PAUSED: "paused",
    SATURATED: "engines_saturated",
    IDLE: "engines_idle",
}
BALANCED = "balanced"


def verdict(share: Sequence[float], thresholds: VerdictThresholds = VerdictThresholds()) -> str:
    """Which side the bottleneck is on: of the classes at or above their threshold
    (:class:`VerdictThresholds`), the one with the largest share (ties: syncing, paused,
    saturated, idle, in that order); ``balanced`` when none is."""
    limits = {
        SYNCING: thresholds.syncing,
        PAUSED: thresholds.paused,
        SATURATED: thresholds.saturated,
        IDLE: thresholds.idle,
    }
    best: tuple[float, int] | None = None
    for rank, k in enumerate(VERDICTS):
        if share[k] >= limits[k] and (best is None or share[k] > best[0]):
            best = (share[k], rank)
    return BALANCED if best is None else list(VERDICTS.values())[best[1]]


def bottleneck_role(role_shares: Mapping[str, Sequence[float]]) -> str | None:
    """On a prefill/decode fleet, the role that holds the fleet back: the one with the larger
    saturated share, ties broken by the larger busy + saturated share (the busier side);
    None unless both roles have shares and one of them is the busier."""
    if "prefill" not in role_shares or "decode" not in role_shares:
        return None

    def load(role: str) -> tuple[float, float]:
        s = role_shares[role]
        return s[SATURATED], s[BUSY] + s[SATURATED]

    prefill, decode = load("prefill"), load("decode")
    if prefill == decode:
        return None
    return "prefill" if prefill > decode else "decode"
