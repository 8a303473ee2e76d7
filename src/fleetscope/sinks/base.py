"""The sink interface: where fleet statistics go after they are reduced to keys.

Every sink implements :class:`Sink` (``log``, ``log_summary``, ``close``). The optional hooks are
declared here as protocols too; a sink that has one of them receives it:

* :class:`PollSink` ``log_poll(result)``: the whole poll (statistics, events), for sinks that
  draw the fleet; it replaces ``log`` for that sink;
* :class:`EventSink` ``log_events(events)``: the poll's health events;
* :class:`WindowSink` ``on_window_start(label)`` / ``on_window_stop(label)``;
* :class:`RunSink` ``on_run_end(status)``: after the run summary.

A sink never raises into the caller's loop for tracker-side trouble: it logs a rate-limited
warning and drops what it could not write. The collector feeds each sink from its own bounded
queue and thread (:mod:`fleetscope.sinks.fanout`), so a slow sink only delays itself.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from fleetscope.fleet.state import PollResult
    from fleetscope.health import HealthEvent

Value = float | int | str


@runtime_checkable
class Sink(Protocol):
    """Receives one flat mapping per poll, and the run summary at the end (and on demand)."""

    def log(self, metrics: Mapping[str, Value], *, step: int, wall_time: float) -> None:
        """Record one poll's keys. ``step`` counts polls from 0; ``wall_time`` is Unix seconds."""
        ...

    def log_summary(self, summary: Mapping[str, Value]) -> None:
        """Record (or overwrite) run-level summary values."""
        ...

    def close(self) -> None:
        """Flush and release resources. Idempotent."""
        ...


@runtime_checkable
class PollSink(Protocol):
    def log_poll(self, result: PollResult) -> None: ...


@runtime_checkable
class EventSink(Protocol):
    def log_events(self, events: Sequence[HealthEvent]) -> None: ...


@runtime_checkable
class WindowSink(Protocol):
    def on_window_start(self, label: str) -> None: ...

    def on_window_stop(self, label: str) -> None: ...


@runtime_checkable
class RunSink(Protocol):
    def on_run_end(self, status: str) -> None: ...


def numeric(value: Any) -> float | None:
    """A value as a float for a chart (bools as 0/1), or None for what is not a number."""
    if isinstance(value, bool | numbers.Real):
        return float(value)
    return None
