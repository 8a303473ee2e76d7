"""Where a :class:`~fleetscope.collector.core.Collector`'s polls run: its backend.

The collector (the trainer's side: poll schedule, handles, sinks, ``on_poll``) holds one
backend, chosen by ``isolation=``: :class:`~fleetscope.collector.inline.InlineBackend` scrapes
and computes in this process, :class:`~fleetscope.collector.process.ProcessBackend` in a
supervised child process. A backend runs one poll at a time (boundaries included) and hands
every finished poll to the collector's ``publish``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fleetscope.fleet.view import FleetView
from fleetscope.sources.base import Source

Publish = Callable[[FleetView, float], None]
"""A finished poll's view and when it started (``time.monotonic()``): the collector logs it."""


class Backend(Protocol):
    """The work of a collector: polls, boundaries, RL announcements, summary and state."""

    source: Source  # the membership methods act on it

    @property
    def policy_version(self) -> str | None: ...

    def set_policy_version(self, version: str) -> None: ...

    async def wait_ready(self, timeout: float) -> None: ...

    async def poll(self, *, row_floor: float = 0.0) -> FleetView:
        """One poll, published; a row less than ``row_floor`` seconds after the previous row
        that showed rates is held (instant values only)."""
        ...

    async def window(self, action: str, label: str) -> dict[str, float]:
        """A window boundary: a poll, then ``action`` at its scrape times; its keys ride in
        the poll's row and are returned."""
        ...

    async def sync(self, action: str, token: int, version: str, *, ok: bool) -> dict[str, float]:
        """A weight-sync boundary (``enter`` / ``exit``): a poll, then the sync's bookkeeping."""
        ...

    async def close_windows(self, now: float) -> None: ...

    def summary(self, status: str) -> dict[str, float | str]: ...

    async def asummary(self, status: str) -> dict[str, float | str]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """Continue a saved run summary; the windows it has open and paused."""
        ...

    def collector_keys(self, prefix: str) -> dict[str, float]:
        """The backend's own keys in every row (``{prefix}/collector/...``)."""
        ...

    async def aclose(self, status: str) -> None:
        """Release the source, probes and workers (bounded; never raises). ``status``: the
        run's, for what a closed collector still answers."""
        ...
