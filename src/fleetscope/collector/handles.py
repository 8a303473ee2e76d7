"""Window handles: the trainer's side of window boundaries.

A boundary is checked when it is called (misuse raises :class:`WindowError` at once, in the
caller's thread) and then applied by the collector after a poll, in the order boundaries were
called. A synchronous call waits for its boundary poll at most ``config.boundary_wait``
seconds (2 x timeout + 5 s by default); if the fleet is slower, it returns anyway (``stop()``
then returns ``{}``; the window's keys are still logged and the window still closes, in order),
so a slow fleet or sink never blocks or raises into training.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from fleetscope.stats.windows import WindowError, check_action

if TYPE_CHECKING:
    from fleetscope.collector.core import Collector


class BoundaryLedger:
    """The windows as the trainer declared them (ahead of the polls that apply them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active: set[str] = set()
        self.paused: set[str] = set()

    def declare(self, action: str, label: str) -> None:
        """Check ``action`` against the declared state and record it (thread-safe)."""
        with self._lock:
            check_action(action, label, self.active, self.paused)
            if action in ("start", "resume"):
                self.paused.discard(label)
                self.active.add(label)
            elif action == "pause":
                self.active.discard(label)
                self.paused.add(label)
            else:
                self.active.discard(label)
                self.paused.discard(label)


class WindowHandle:
    """Controls one window. Sync methods need ``start_background()`` (started on demand);
    async ones (``astart`` ...) run on the caller's loop."""

    def __init__(self, collector: Collector, label: str):
        self.collector = collector
        self.label = label
        self.keys: dict[str, float] = {}

    async def _abound(self, action: str) -> dict[str, float]:
        self.collector._ledger.declare(action, self.label)
        return await self.collector._boundary(action, self.label)

    def _bound(self, action: str) -> dict[str, float]:
        c = self.collector
        own = getattr(c, "_thread", None)
        if own is not None and threading.current_thread() is own:
            # misuse, refused before the window's declared state changes
            raise WindowError("inside the collector's own loop, use the async methods")
        c._ledger.declare(action, self.label)
        keys = c._run_sync(c._boundary(action, self.label), c.config.boundary_wait)
        return keys or {}

    async def astart(self) -> WindowHandle:
        await self._abound("start")
        return self

    async def apause(self) -> None:
        await self._abound("pause")

    async def aresume(self) -> None:
        await self._abound("resume")

    async def astop(self) -> dict[str, float]:
        self.keys = await self._abound("stop")
        return self.keys

    def start(self) -> WindowHandle:
        self._bound("start")
        return self

    def pause(self) -> None:
        self._bound("pause")

    def resume(self) -> None:
        self._bound("resume")

    def stop(self) -> dict[str, float]:
        self.keys = self._bound("stop")
        return self.keys

    def __enter__(self) -> WindowHandle:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> WindowHandle:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()
