"""A collector's own event loop in a daemon thread, for synchronous trainers
(``Collector.start_background()``), and the synchronous calls that run on it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fleetscope.stats.windows import WindowError
from fleetscope.util.warn import RateLimitedWarner

T = TypeVar("T")


class LoopThread:
    """Runs ``start()`` on a new event loop in a daemon thread, the loop until :meth:`stop`,
    then ``stop()`` on it."""

    def __init__(
        self,
        start: Callable[[], Coroutine[Any, Any, None]],
        stop: Callable[[], Coroutine[Any, Any, None]],
        warner: RateLimitedWarner,
    ):
        self._start, self._stop = start, stop
        self._warner = warner
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        if self.thread is not None:
            return
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._stop())
            loop.close()

        self.thread = threading.Thread(target=run, name="fleetscope", daemon=True)
        self.thread.start()
        ready.wait(10)

    def stop(self, timeout: float) -> None:
        if self.thread is None or self.loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        self.thread = None

    def in_own_thread(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self.thread is not None and threading.current_thread() is self.thread

    def run(self, coro: Coroutine[Any, Any, T], wait: float) -> T | None:
        """Run a collector coroutine from synchronous code on the background loop (started on
        demand); returns None (the coroutine carries on, in order) if it takes longer than
        ``wait``."""
        if self.loop is None:
            self.start()
        assert self.loop is not None
        if self.in_own_thread():
            coro.close()
            raise WindowError("inside the collector's own loop, use the async methods")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(wait)
        except TimeoutError:
            self._warner.warn(
                "boundary-late",
                f"a window boundary took longer than {wait:g} s (slow fleet); it completes "
                "in the background, in order",
            )
            return None
