"""Feeding sinks without ever blocking the collector: one bounded queue and one thread per sink.

A poll is handed to every sink's queue and the collector moves on. A sink slower than the polls
fills its queue; further polls are dropped *for that sink only* (counted in
``{prefix}/collector/sink_rows_dropped/{name}``, warned with the sink's name), and its queue
drains when it recovers. Window boundaries, the run summary and the end of the run are never
dropped (they jump the bound). :meth:`SinkFanout.close` closes every sink within one deadline;
the threads are daemons, so a sink whose ``close()`` hangs never keeps the process from exiting.

Key sets: a sink with ``key_set = "compact"`` (W&B by default) gets the compact subset of each
poll's keys and of the run summary (:class:`fleetscope.keys.KeyDict`, marked where the keys are
rendered); any other sink gets the full set. The subset is taken in the sink's own thread.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from fleetscope.keys import KeySet, key_set_of
from fleetscope.sinks.base import EventSink, PollSink, RunSink, Sink, WindowSink
from fleetscope.util.warn import RateLimitedWarner

if TYPE_CHECKING:
    from fleetscope.fleet.state import PollResult

log = logging.getLogger("fleetscope")

DEFAULT_QUEUE = 64
_STOP = object()


class _Worker:
    """One sink, its queue and its thread."""

    def __init__(self, sink: Sink, name: str, bound: int, warner: RateLimitedWarner):
        self.sink = sink
        self.name = name
        self.bound = bound
        self.dropped = 0
        self._warner = warner
        self._items: collections.deque[object] = collections.deque()
        self._polls = 0  # polls in the queue (the bounded kind)
        self._cv = threading.Condition()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(
            target=self._run, name=f"fleetscope-sink-{name}", daemon=True
        )
        self._thread.start()

    def put(self, fn: Callable[..., Any], *args: Any, droppable: bool = False) -> bool:
        with self._cv:
            if droppable and self._polls >= self.bound:
                self.dropped += 1
                self._warner.warn(
                    f"sink-dropped:{self.name}",
                    f"sink {self.name} is {self.bound} polls behind: dropped a poll for it "
                    f"({self.dropped} so far); other sinks and polling are unaffected",
                )
                return False
            if droppable:
                self._polls += 1
            self._items.append((fn, args, droppable))
            self._idle.clear()
            self._cv.notify()
        return True

    def stop(self) -> None:
        with self._cv:
            self._items.append(_STOP)
            self._idle.clear()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items:
                    self._idle.set()
                    self._cv.wait()
                item = self._items.popleft()
            if item is _STOP:
                self._idle.set()
                return
            fn, args, droppable = cast("tuple[Callable[..., Any], tuple[Any, ...], bool]", item)
            try:
                fn(*args)
            except Exception as e:
                self._warner.warn(f"sink:{self.name}", f"sink {self.name} failed: {e!r}")
            finally:
                if droppable:
                    with self._cv:
                        self._polls -= 1

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(timeout)

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


class SinkFanout:
    """Every sink of a collector behind its own queue and thread."""

    def __init__(self, sinks: Sequence[Sink], *, queue_size: int = DEFAULT_QUEUE):
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")
        names: dict[str, int] = {}
        self._workers: list[_Worker] = []
        for sink in sinks:
            base = type(sink).__name__
            n = names.get(base, 0)
            names[base] = n + 1
            name = base if n == 0 else f"{base}{n}"
            self._workers.append(_Worker(sink, name, max(1, queue_size), self._warner))
        self._closed = False

    def __bool__(self) -> bool:
        return bool(self._workers)

    @property
    def sinks(self) -> list[Sink]:
        return [w.sink for w in self._workers]

    def dropped(self) -> dict[str, int]:
        """Polls dropped so far, per sink name."""
        return {w.name: w.dropped for w in self._workers}

    def poll(self, result: PollResult) -> None:
        """Hand one poll to every sink (never blocks; a full queue drops it for that sink)."""
        for w in self._workers:
            sink = w.sink
            if isinstance(sink, PollSink):
                w.put(sink.log_poll, result, droppable=True)
            else:
                w.put(_log_keys, sink, result, droppable=True)
            if result.events and isinstance(sink, EventSink):
                w.put(sink.log_events, list(result.events))

    def window(self, action: str, label: str) -> None:
        for w in self._workers:
            if isinstance(w.sink, WindowSink):
                hook = w.sink.on_window_start if action == "start" else w.sink.on_window_stop
                w.put(hook, label)

    def summary(self, summary: Mapping[str, Any]) -> None:
        compact: dict[str, Any] | None = None
        for w in self._workers:
            if sink_key_set(w.sink) == "compact":
                if compact is None:
                    compact = dict(key_set_of(summary, "compact"))
                w.put(w.sink.log_summary, dict(compact))
            else:
                w.put(w.sink.log_summary, dict(summary))

    def run_end(self, status: str) -> None:
        for w in self._workers:
            if isinstance(w.sink, RunSink):
                w.put(w.sink.on_run_end, status)

    def flush(self, timeout: float) -> bool:
        """Wait until every queue is empty (at most ``timeout`` seconds in all)."""
        deadline = time.monotonic() + timeout
        return all(w.wait_idle(max(0.0, deadline - time.monotonic())) for w in self._workers)

    def close(self, timeout: float = 10.0) -> None:
        """Drain and close every sink, all within ``timeout`` seconds; never raises. A sink
        still busy at the deadline is left to its daemon thread (named in a warning)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        for w in self._workers:
            w.put(w.sink.close)
            w.stop()
        for w in self._workers:
            if not w.join(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "fleetscope: sink %s did not finish closing within %g s; left behind",
                    w.name,
                    timeout,
                )


def sink_key_set(sink: object) -> KeySet:
    """The key set a sink asks for with its ``key_set`` attribute (default: full)."""
    return "compact" if getattr(sink, "key_set", "full") == "compact" else "full"


def _log_keys(sink: Sink, result: PollResult) -> None:
    keys = key_set_of(result.keys, sink_key_set(sink))
    sink.log(keys, step=result.step, wall_time=result.wall_time)
