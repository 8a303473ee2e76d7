"""A collector's boundaries as its handles see them (window handles:
:class:`~fleetscope.collector.handles.WindowBoundaries`; weight-sync handles:
:class:`~fleetscope.rl.weight_sync.SyncBoundaries`): declared in the caller's thread, applied by
the backend after a poll, in the order they were called."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from fleetscope.collector.backend import Backend
from fleetscope.collector.handles import BoundaryLedger
from fleetscope.collector.loop import LoopThread
from fleetscope.rl.weight_sync import WeightSyncHandle
from fleetscope.sinks.fanout import SinkFanout


class Boundaries:
    """Window and weight-sync boundaries of one collector."""

    def __init__(self, backend: Backend, fanout: SinkFanout, loop: LoopThread, wait: float):
        self.backend = backend
        self.fanout = fanout
        self.loop = loop
        self.wait = wait  # config.boundary_wait: how long a synchronous boundary waits
        self.ledger = BoundaryLedger()  # the windows as the trainer declared them

    def in_own_loop(self) -> bool:
        return self.loop.in_own_thread()

    async def window(self, action: str, label: str) -> dict[str, float]:
        keys = await self.backend.window(action, label)
        if action in ("start", "stop"):
            self.fanout.window(action, label)  # after the row that carries the boundary
        return keys

    async def sync(self, action: str, handle: WeightSyncHandle, *, ok: bool) -> dict[str, float]:
        return await self.backend.sync(action, handle.token, handle.version, ok=ok)

    def run(self, boundary: Coroutine[Any, Any, dict[str, float]]) -> dict[str, float] | None:
        return self.loop.run(boundary, self.wait)
