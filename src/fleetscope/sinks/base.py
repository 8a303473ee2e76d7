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

:class:`SinkBase` is what the bundled sinks share: a context manager that closes the sink, the
optional hooks as no-ops, and the lazy import of the library a sink writes through, with one
clear error naming the pip extra that installs it.
"""

from __future__ import annotations

import importlib
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, runtime_checkable

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


class SinkBase:
    """The plumbing the bundled sinks share (they implement :class:`Sink` themselves).

    * ``with sink: ...`` closes it at the end (``close`` is idempotent);
    * the optional hooks ``log_events``, ``on_window_start`` / ``on_window_stop`` and
      ``on_run_end`` do nothing unless a sink overrides them (``log_poll`` is not one of them:
      a sink that has it gets it instead of ``log``);
    * :meth:`_import_extra` imports the library of the pip extra ``extra`` when the sink is
      built, so fleetscope works without it.
    """

    #: the pip extra that installs the library this sink writes through (``fleetscope[extra]``)
    extra: ClassVar[str | None] = None

    def close(self) -> None:
        """Flush and release resources. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def log_events(self, events: Sequence[HealthEvent]) -> None:
        """The poll's health events (ignored unless overridden)."""

    def on_window_start(self, label: str) -> None:
        """A window opened (ignored unless overridden)."""

    def on_window_stop(self, label: str) -> None:
        """A window closed (ignored unless overridden)."""

    def on_run_end(self, status: str) -> None:
        """The run ended, after its summary (ignored unless overridden)."""

    @classmethod
    def _import_extra(cls, *names: str) -> tuple[Any, ...]:
        """Import ``names`` (``"package.module"`` or ``"package.module:attribute"``) from the
        sink's extra, or raise an ImportError that names the pip extra to install."""
        out: list[Any] = []
        try:
            for name in names:
                module, _, attribute = name.partition(":")
                found: Any = importlib.import_module(module)
                out.append(getattr(found, attribute) if attribute else found)
        except (ImportError, AttributeError) as e:
            raise ImportError(
                f"{cls.__name__} needs the '{cls.extra}' package: "
                f"pip install 'fleetscope[{cls.extra}]'"
            ) from e
        return tuple(out)


def numeric(value: Any) -> float | None:
    """A value as a float for a chart (bools as 0/1), or None for what is not a number."""
    if isinstance(value, bool | numbers.Real):
        return float(value)
    return None
