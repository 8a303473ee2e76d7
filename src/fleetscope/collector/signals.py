"""Stop a collector cleanly on SIGINT / SIGTERM / SIGHUP: last poll, run summary, sinks closed.

A process that is sent SIGTERM (a scheduler's preemption, ``kill``, ``docker stop``) or SIGHUP
(the terminal went away) dies at once by default: no last poll, no run summary, a W&B run
marked "crashed". :func:`stop_on_signals` makes those signals stop the collector the way
``Collector.stop()`` / ``stop_background()`` does first.

Two ways a collector runs, two mechanisms, both signal-safe (the handler itself only records
the signal; the stop runs in a safe place):

* **asyncio** (``async with Collector(...)`` or ``await collector.start()``): call
  ``stop_on_signals(collector)`` inside the running loop. It uses ``loop.add_signal_handler``;
  the handler schedules ``await collector.stop()`` as a task on that loop. ``await
  handle.wait()`` returns once the stop has finished (the CLI's ``watch`` waits on it).
* **background thread** (``collector.start_background()``): call ``stop_on_signals(collector)``
  from the main thread with no running loop. A Python ``signal.signal`` handler (which Python
  always runs in the main thread) only sets a ``threading.Event``; a small watcher thread calls
  ``collector.stop_background()``. At interpreter exit, a stop in progress is waited for.

``chain=True`` (the default): once the collector has stopped, the signal does what it did
before: the previous Python handler is called (for SIGINT that raises ``KeyboardInterrupt`` in
the main thread), and a signal whose previous disposition was the default (SIGTERM, SIGHUP)
is re-raised with that default, so the process still terminates, after the clean stop.
``chain=False``: the signal only stops the collector (what ``fleetscope watch`` uses, then
exits 0). ``handle.restore()`` puts the previous handlers back. A second signal while the stop
is running is ignored.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("fleetscope")

DEFAULT_SIGNALS: tuple[int, ...] = tuple(
    s
    for s in (signal.SIGINT, getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
    if s is not None
)


class SignalStop:
    """What :func:`stop_on_signals` returns: which signal arrived, and when the stop ended."""

    def __init__(self, collector: Any, signals: tuple[int, ...], chain: bool) -> None:
        self.collector = collector
        self.signals = signals
        self.chain = chain
        self.received: int | None = None  # the first signal that arrived
        self.stopped = threading.Event()  # set once the collector's stop has finished
        self._previous: dict[int, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_done: asyncio.Event | None = None
        self._requested = threading.Event()
        self._restored = False
        self._ignoring = False

    # ------------------------------------------------------------------ asyncio

    def _install_async(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._async_done = asyncio.Event()
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, self._on_async_signal, sig)

    def ignore_further(self) -> None:
        """A stop is under way elsewhere (e.g. a ``--duration`` ran out): signals from now on
        only log that they are ignored, rather than start a second, concurrent stop."""
        self._ignoring = True

    def _on_async_signal(self, sig: int) -> None:  # runs as a loop callback, not in the handler
        if self._ignoring:
            log.warning("fleetscope: %s: already stopping", _name(sig))
            return
        if self.received is not None:
            return
        self.received = sig
        log.warning("fleetscope: %s: stopping (last poll, run summary)", _name(sig))
        assert self._loop is not None
        self._loop.create_task(self._stop_async(sig), name="fleetscope-signal-stop")

    async def _stop_async(self, sig: int) -> None:
        try:
            with contextlib.suppress(Exception):
                await self.collector.stop()
        finally:
            self.stopped.set()
            assert self._async_done is not None
            self._async_done.set()
            if self.chain:
                self.restore()
                _redeliver(sig, self._previous.get(sig))

    async def wait(self) -> int:
        """(asyncio) Wait until a signal arrived and the collector has stopped; the signal."""
        assert self._async_done is not None, "wait() is for the asyncio mode"
        await self._async_done.wait()
        assert self.received is not None
        return self.received

    # ------------------------------------------------------------------ threads

    def _install_thread(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "stop_on_signals: signal handlers can only be set in the main thread"
            )
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_thread_signal)
        threading.Thread(target=self._watch, name="fleetscope-signals", daemon=True).start()
        atexit.register(self._wait_at_exit)

    def _on_thread_signal(self, sig: int, frame: Any) -> None:
        # the handler: record and wake the watcher, nothing else
        if self.received is None:
            self.received = sig
            self._requested.set()
            return
        if self.stopped.is_set() and self.chain:  # re-delivered after the stop (see _watch)
            self.restore()
            _redeliver(sig, self._previous.get(sig), frame)

    def _watch(self) -> None:
        self._requested.wait()
        sig = self.received
        assert sig is not None
        log.warning("fleetscope: %s: stopping (last poll, run summary)", _name(sig))
        try:
            self.collector.stop_background()
        except Exception as e:  # never let the watcher die silently
            log.warning("fleetscope: stop on %s failed: %r", _name(sig), e)
        finally:
            self.stopped.set()
        if self.chain and not self._restored:
            # back through our handler, in the main thread, which chains the previous one
            with contextlib.suppress(OSError):
                os.kill(os.getpid(), sig)

    def _wait_at_exit(self) -> None:
        if self._requested.is_set():
            self.stopped.wait(60)

    # ------------------------------------------------------------------ both

    def restore(self) -> None:
        """Put the previous handlers back (idempotent; main thread or the collector's loop)."""
        if self._restored:
            return
        self._restored = True
        for sig, prev in self._previous.items():
            with contextlib.suppress(Exception):
                if self._loop is not None:
                    self._loop.remove_signal_handler(sig)
                if prev is not None:
                    signal.signal(sig, prev)


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _redeliver(sig: int, previous: Any, frame: Any = None) -> None:
    """Do what ``previous`` (a disposition from ``signal.getsignal``) would have done."""
    if previous is signal.SIG_IGN or previous is None:
        return
    if previous is signal.SIG_DFL:
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)
        return
    if callable(previous):
        previous(sig, frame)


def stop_on_signals(
    collector: Any,
    signals: Iterable[int] = DEFAULT_SIGNALS,
    *,
    chain: bool = True,
    loop: asyncio.AbstractEventLoop | None = None,
) -> SignalStop:
    """Stop ``collector`` cleanly when one of ``signals`` arrives (see the module docstring).

    In a running event loop (or with ``loop=``): the asyncio mode, ``await collector.stop()``.
    Otherwise (main thread, collector started with ``start_background()``): the thread mode,
    ``collector.stop_background()`` from a watcher thread. Returns a :class:`SignalStop`.
    """
    handle = SignalStop(collector, tuple(signals), chain)
    if loop is None:
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
    if loop is not None:
        handle._install_async(loop)
    else:
        handle._install_thread()
    return handle
