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
5. ``idle``: nothing running and nothing waiting for capacity at the end scrape.

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
#: one engine's interval: (its class, its seconds)
Phase = tuple[int, float]

_RUNNING = "vllm:" + catalog.RUNNING
_WAITING = "vllm:" + catalog.WAITING
_KV = "vllm:" + catalog.KV_USAGE
_CAPACITY = (("reason", "capacity"),)


@dataclass(frozen=True, slots=True)
class _Slots:
    """Where one layout keeps what the classes are judged on (-1: absent)."""

    running: int
    waiting: int
    kv: int
    preemptions: int
    idle_counter: int


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
    )
    if len(_SLOTS) > 4096:
        _SLOTS.clear()
    _SLOTS[id(layout)] = (layout, s)
    return s


class PhaseClassifier:
    """Puts each engine's interval of a poll in one class (the rules of this module's doc).

    Keeps one bit per engine between polls: whether requests were waiting for capacity at its
    last scrape (a queue at both ends of an interval is saturation)."""

    def __init__(self, kv_full: float = 0.95) -> None:
        self.kv_full = kv_full
        self._queued: dict[str, bool] = {}

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
        queued = self._queued
        kv_full = self.kv_full
        for i, inp in enumerate(inputs):
            if not inp.is_engine:
                out.append(None)
                continue
            d = inp.delta
            data = d.current.data
            s = _slots(d.current.layout)
            waiting = float(data[s.waiting]) if s.waiting >= 0 else math.nan
            was = queued.get(inp.engine_id, False)
            queued[inp.engine_id] = now = waiting > 0
            secs = float(d.seconds)
            if d.baseline_only or not secs > 0:
                out.append(None)
            elif syncing:
                out.append((SYNCING, secs))
            elif held is not None and held[i]:
                out.append((PAUSED, secs))
            else:
                running = float(data[s.running]) if s.running >= 0 else math.nan
                if running != running and waiting != waiting:
                    out.append(None)
                    continue
                kv = float(data[s.kv]) if s.kv >= 0 else math.nan
                pre = float(d.delta[s.preemptions]) if s.preemptions >= 0 else math.nan
                if kv >= kv_full or pre > 0 or (now and was):
                    out.append((SATURATED, secs))
                elif running > 0 or now:
                    out.append((BUSY, secs))
                else:
                    out.append((IDLE, secs))
        if len(queued) > 2 * len(inputs) + 64:  # engines gone for good: forget their bit
            seen = {inp.engine_id for inp in inputs}
            self._queued = {e: q for e, q in queued.items() if e in seen}
        return out


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
