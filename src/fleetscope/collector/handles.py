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
from collections.abc import Coroutine, Iterable
from typing import Any, Protocol

from fleetscope.stats.windows import WindowError, check_action


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

    def reset(self, active: Iterable[str], paused: Iterable[str]) -> None:
        """The declared windows are those of a restored state."""
        with self._lock:
            self.active, self.paused = set(active), set(paused)


class WindowBoundaries(Protocol):
    """What a window handle needs of its collector (the collector's
    :class:`~fleetscope.collector.boundaries.Boundaries`)."""

    @property
    def ledger(self) -> BoundaryLedger: ...

    def in_own_loop(self) -> bool:
        """Whether the caller runs on the collector's own background loop."""
        ...

    async def window(self, action: str, label: str) -> dict[str, float]:
        """Apply a window boundary after a poll; the window's keys (for ``stop``)."""
        ...

    def run(self, boundary: Coroutine[Any, Any, dict[str, float]]) -> dict[str, float] | None:
        """Run a boundary from synchronous code, waiting at most ``config.boundary_wait``."""
        ...


class WindowHandle:
    """Controls one window. Sync methods need ``start_background()`` (started on demand);
    async ones (``astart`` ...) run on the caller's loop."""

    def __init__(self, boundaries: WindowBoundaries, label: str):
        self.boundaries = boundaries
        self.label = label
        self.keys: dict[str, float] = {}

    async def _abound(self, action: str) -> dict[str, float]:
        self.boundaries.ledger.declare(action, self.label)
        return await self.boundaries.window(action, self.label)

    def _bound(self, action: str) -> dict[str, float]:
        b = self.boundaries
        if b.in_own_loop():
            # misuse, refused before the window's declared state changes
            raise WindowError("inside the collector's own loop, use the async methods")
        b.ledger.declare(action, self.label)
        return b.run(b.window(action, self.label)) or {}

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
