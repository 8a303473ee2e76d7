"""The typed state of the fleet after one poll, for admission control and ``on_poll`` callbacks.

A value the engine did not report is ``None``, never 0 (a missing gauge read as 0 looks healthy,
which is dangerous for a concurrency controller).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from fleetscope import catalog
from fleetscope.fleet.state import PollResult
from fleetscope.identity import EngineId, Role
from fleetscope.stats.deltas import EngineDelta


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine's load, for admission control. Missing values are None, never 0."""

    engine_id: EngineId
    endpoint: str
    role: Role | None
    reporting: bool
    kv_usage: float | None
    running: float | None
    waiting: float | None
    waiting_for_capacity: float | None
    preemptions_since_last_poll: float | None
    kv_capacity_tokens: float | None
    max_model_len: int | None


class Engines(Mapping[str, EngineLoad]):
    """Engine id -> :class:`EngineLoad`; looked up by :class:`EngineId` or its rendering."""

    __slots__ = ("_loads",)

    def __init__(self, loads: dict[EngineId, EngineLoad]):
        self._loads = loads

    def __getitem__(self, engine_id: str) -> EngineLoad:
        return self._loads[engine_id]  # type: ignore[index]  # EngineId hashes as its text

    def __iter__(self) -> Iterator[EngineId]:
        return iter(self._loads)

    def __len__(self) -> int:
        return len(self._loads)

    def __repr__(self) -> str:
        return f"Engines({list(self._loads)})"


@dataclass(frozen=True, slots=True)
class FleetView:
    """The typed state of the fleet after one poll (what ``on_poll`` receives)."""

    step: int
    wall_time: float
    engines: Engines
    endpoints_reporting: int
    endpoints_expected: int
    keys: Mapping[str, float]
    result: PollResult


def counter_increase(delta: EngineDelta | None, family: str) -> float | None:
    """The exact increase of a counter family (all its children) in one engine delta."""
    if delta is None or delta.baseline_only:
        return None
    slots = [c.slot for c in delta.layout.counters if c.name == family]
    if not slots:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        v = float(delta.delta[slots].sum())
    return v if math.isfinite(v) else None  # unknown, or past float64 (docs/bad-data.md §13)


def _get(metrics: Mapping[str, float], name: str) -> float | None:
    v = metrics.get(name)
    return None if v is None or math.isnan(v) else v


def build_view(
    result: PollResult,
    *,
    known_engines: Iterable[EngineId],
    engine_roles: Mapping[EngineId, Role | None],
    endpoint_roles: Mapping[str, Role | None],
    max_model_len: Mapping[str, int | None],
) -> FleetView:
    """The view of one poll: every engine that reported, and every engine seen before that
    did not (``reporting=False``, nothing known)."""
    stats = result.stats
    loads: dict[EngineId, EngineLoad] = {}
    read = (
        catalog.KV_USAGE,
        catalog.RUNNING,
        catalog.WAITING,
        catalog.WAITING_FOR_CAPACITY,
        catalog.KV_CAPACITY_TOKENS,
    )
    for eid, m in stats.engine_values(read).items():
        e = eid if isinstance(eid, EngineId) else EngineId.from_json(eid)
        loads[e] = EngineLoad(
            engine_id=e,
            endpoint=e.endpoint,
            role=engine_roles.get(e, endpoint_roles.get(e.endpoint)),
            reporting=True,
            kv_usage=_get(m, catalog.KV_USAGE),
            running=_get(m, catalog.RUNNING),
            waiting=_get(m, catalog.WAITING),
            waiting_for_capacity=_get(m, catalog.WAITING_FOR_CAPACITY),
            preemptions_since_last_poll=counter_increase(
                result.deltas.get(e), catalog.PREEMPTIONS_FAMILY
            ),
            kv_capacity_tokens=_get(m, catalog.KV_CAPACITY_TOKENS),
            max_model_len=max_model_len.get(e.endpoint),
        )
    for e in known_engines:
        if e not in loads and e.is_engine:
            loads[e] = EngineLoad(
                e,
                e.endpoint,
                endpoint_roles.get(e.endpoint),
                False,
                None,
                None,
                None,
                None,
                None,
                None,
                max_model_len.get(e.endpoint),
            )
    return FleetView(
        step=result.step,
        wall_time=result.wall_time,
        engines=Engines(loads),
        endpoints_reporting=sum(1 for s in result.scrapes if s.ok),
        endpoints_expected=len(result.scrapes),
        keys=result.keys,
        result=result,
    )
