"""The poll loop: a source's scrapes -> fleet state -> windows, health, view -> sinks.

``Collector`` is asyncio-native (``async with Collector(...)``, ``await collector.poll()``);
``Collector.start_background()`` runs it in its own thread for synchronous trainers. Nothing in
it raises into the caller's loop: failures become metrics and rate-limited warnings. Every
public method may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fleetscope.collector.handles import BoundaryLedger, WindowHandle
from fleetscope.collector.rl import RLLifecycle
from fleetscope.fleet.config import CollectorConfig
from fleetscope.fleet.pipeline import PollPipeline
from fleetscope.fleet.report import accumulator_keys
from fleetscope.fleet.view import EngineLoad, FleetView
from fleetscope.keys import KeyDict, key_prefix
from fleetscope.sinks.base import Sink
from fleetscope.sinks.fanout import SinkFanout
from fleetscope.sources.base import MembershipSource, ModelInfoSource, Source
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.stats.windows import WindowError
from fleetscope.util.warn import RateLimitedWarner

__all__ = ["Collector", "EngineLoad", "FleetView", "WindowError", "WindowHandle"]

log = logging.getLogger("fleetscope")
T = TypeVar("T")


class Collector(RLLifecycle):
    """Watches a fleet of vLLM endpoints and logs correct fleet statistics every poll.

    Args:
        endpoints: base URLs or :class:`Endpoint` objects (names ``server0``... are assigned
            in order, per role), scraped over HTTP.
        source: another :class:`~fleetscope.sources.base.Source` instead (Ray agents, a
            Prometheus server, shards); not together with ``endpoints``.
        config: a :class:`~fleetscope.fleet.config.CollectorConfig`; keyword options (``interval``,
            ``timeout``, ``schema``, ...: its fields) override it.
        sinks: where keys go (W&B, JSONL, terminal, ...), each fed from its own queue.
        on_poll: called with a :class:`FleetView` after every poll (exceptions are logged).
    """

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint] = (),
        *,
        source: Source | None = None,
        config: CollectorConfig | None = None,
        sinks: Sequence[Sink] = (),
        on_poll: Callable[[FleetView], None] | None = None,
        **options: Any,
    ):
        self.config = (config or CollectorConfig()).with_options(**options)
        cfg = self.config
        if source is not None and endpoints:
            raise ValueError("give endpoints (scraped over HTTP) or a source, not both")
        self.source: Source = source or HttpSource(endpoints, **cfg.http_options())
        self.pipeline = PollPipeline(cfg)
        self.state, self.windows = self.pipeline.state, self.pipeline.windows
        self.health = self.pipeline.health
        self._init_rl(self.pipeline)  # policy versions, what endpoints serve, weight syncs
        self._init_loop(sinks, on_poll)

    def __new__(cls, *args: Any, **kwargs: Any) -> Collector:
        # isolation="process" (or "auto" over a fleet size) is the same API with the work in a
        # child process: fleetscope.collector.process
        if cls is Collector and kwargs.get("source") is None:
            from fleetscope.collector.process import IsolatedCollector, wants_process

            if wants_process(args[0] if args else kwargs.get("endpoints", ()), kwargs):
                return super().__new__(IsolatedCollector)
        return super().__new__(cls)

    def _init_loop(
        self, sinks: Sequence[Sink], on_poll: Callable[[FleetView], None] | None
    ) -> None:
        """What the trainer's side of any collector holds: the loop, sinks and boundaries."""
        cfg = self.config
        self.interval = cfg.interval
        self.timeout = cfg.timeout
        self.on_poll = on_poll
        self.fanout = SinkFanout(sinks, queue_size=cfg.sink_queue)
        self.run_status = "running"
        self.last: FleetView | None = None
        self._prefix = key_prefix(cfg.key_options)
        self._ledger = BoundaryLedger()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fleetscope-stats")
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")
        self._task: asyncio.Task[None] | None = None
        self._poll_lock: asyncio.Lock | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._summary_published = False
        self._closed = False
        self._ticks_skipped = 0
        self._poll_seconds = 0.0

    # ------------------------------------------------------------------ fleet membership

    @property
    def sinks(self) -> list[Sink]:
        return self.fanout.sinks

    @property
    def endpoints(self) -> list[Endpoint]:
        """The watched endpoints (empty for sources without endpoints of their own)."""
        src = self.source
        return list(src.endpoints) if isinstance(src, MembershipSource) else []

    def _members(self) -> MembershipSource:
        if not isinstance(self.source, MembershipSource):
            raise TypeError(f"{type(self.source).__name__} has no endpoints to change")
        return self.source

    def add_endpoints(self, *endpoints: str | Endpoint) -> list[Endpoint]:
        """Watch more endpoints from the next poll on (any thread); returns them, named. Open
        windows expect an added endpoint's engines from its first scrape."""
        return self._members().add_endpoints(*endpoints)

    def remove_endpoints(self, *endpoints: str | Endpoint) -> list[str]:
        """Stop watching endpoints (by name, URL or :class:`Endpoint`) from the next poll on;
        their baselines are dropped; open windows keep what they summed and expect their
        engines only up to their last scrape."""
        return self._members().remove_endpoints(*endpoints)

    def set_endpoints(
        self, endpoints: Sequence[str | Endpoint]
    ) -> tuple[list[Endpoint], list[str]]:
        """Make the watched fleet exactly ``endpoints`` from the next poll on (matched by URL).
        Returns ``(added, removed names)``."""
        return self._members().set_endpoints(endpoints)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Collector:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start polling in the background of the running event loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="fleetscope-collector")

    async def stop(self, status: str | None = None, *, timeout: float = 30.0) -> None:
        """Stop polling, take a last poll, publish the run summary and close the sinks.

        ``status``: ``"success"`` (default) or ``"failed"``, published as ``run_status``.
        Bounded by ``timeout`` (the sinks' close by ``config.close_timeout``); never raises.
        """
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if not self._closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._finish(status or "success"), timeout=timeout)
        await self._close_source()
        await self._close_rl()
        if not self._closed:
            self._closed = True
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(None, self.fanout.close, self.config.close_timeout)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(fut, timeout=self.config.close_timeout + 1)
            self._pool.shutdown(wait=False)

    async def _close_source(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.source.aclose(), timeout=5)

    def start_background(self) -> Collector:
        """Run the collector in a daemon thread with its own event loop (sync trainers)."""
        if self._thread is not None:
            return self
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name="fleetscope", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop_background(self, timeout: float = 60.0) -> None:
        """Stop the background thread: last poll, run summary, sinks closed (bounded)."""
        if self._thread is None or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._thread = None

    def poll_blocking(self, timeout: float = 60.0) -> FleetView | None:
        """From another thread: run one poll now on the background loop and wait for it."""
        if self._loop is None:
            raise RuntimeError("poll_blocking() needs start_background() first")
        return asyncio.run_coroutine_threadsafe(self.poll(), self._loop).result(timeout)

    def _run_sync(self, coro: Coroutine[Any, Any, T], wait: float) -> T | None:
        """Run a collector coroutine from synchronous code on the background loop; returns
        None (the coroutine carries on, in order) if it takes longer than ``wait``."""
        if self._loop is None:
            self.start_background()
        assert self._loop is not None
        if threading.current_thread() is self._thread:
            coro.close()
            raise WindowError("inside the collector's own loop, use the async methods")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(wait)
        except TimeoutError:
            self._warner.warn(
                "boundary-late",
                f"a window boundary took longer than {wait:g} s (slow fleet); it completes "
                "in the background, in order",
            )
            return None

    # ------------------------------------------------------------------ windows

    def window(self, label: str) -> WindowHandle:
        """A named window (``train``, ``eval``...): ``with``/``async with``, or explicit
        ``start / pause / resume / stop``. Every boundary takes a poll first."""
        return WindowHandle(self, label)

    async def _boundary(self, action: str, label: str) -> dict[str, float]:
        """A window boundary: a poll, then the action at that poll's scrape times; the
        window's keys ride in the same row as the poll's."""
        keys = KeyDict()  # keeps the window keys' compact subset (KeyDict.full_only)

        async def at_boundary(view: FleetView) -> Mapping[str, float]:
            result = view.result
            # each engine's own scrape time at this boundary: coverage is judged per engine
            times = {i.engine_id: i.delta.current.time for i in result.inputs if i.is_engine}
            w = await self._in_stats(self.pipeline.window_action, action, label, result.time, times)
            if action == "stop":
                with self.pipeline.lock:
                    keys.update(
                        accumulator_keys(w.acc, label, self.state.key_options, summary=False)
                    )
                    keys.update(self._rl_window_keys(label))
            return keys

        await self._poll(at_boundary)
        if action in ("start", "stop"):
            self.fanout.window(action, label)  # after the row that carries the boundary
        return keys

    # ------------------------------------------------------------------ summary and state

    def summary(self) -> dict[str, float | str]:
        """The run summary: per run label (each window label, ``idle`` between windows, and
        ``combined`` = the whole run), exact totals, rates, pooled means and quantiles."""
        return self.pipeline.summary(self.run_status)

    async def asummary(self) -> dict[str, float | str]:
        """:meth:`summary` without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.summary)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue the same run summary after a restart (plain
        data: JSON-able; open windows included)."""
        return self.pipeline.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue a saved run summary. Baselines are taken afresh: only what happens from
        now on is counted on top of the saved sums."""
        self.pipeline.load_state_dict(state)
        self._ledger.active = set(self.windows.active)
        self._ledger.paused = set(self.windows.paused)

    async def _finish(self, status: str) -> None:
        if self._summary_published:
            return
        self._summary_published = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.poll(), timeout=self.timeout * 2)
        await self._close_windows(time.monotonic())
        if self.run_status == "running":
            self.run_status = status
        self.fanout.summary(await self.asummary())
        self.fanout.run_end(self.run_status)

    async def _close_windows(self, now: float) -> None:
        await self._in_stats(self.pipeline.close_windows, now)

    # ------------------------------------------------------------------ polling

    async def _run(self) -> None:
        start = time.monotonic()
        k = 0
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._warner.warn("poll", f"poll failed: {type(e).__name__}: {e}")
            # next tick on a fixed grid: no drift; ticks a slow poll overran are skipped,
            # counted and warned about (an overloaded collector is never silent)
            nxt = max(k + 1, math.floor((time.monotonic() - start) / self.interval) + 1)
            if nxt > k + 1:
                self._ticks_skipped += nxt - k - 1
                self._warner.warn(
                    "overload",
                    f"a poll took {self._poll_seconds:.2f} s, longer than the "
                    f"{self.interval:g} s interval: {self._ticks_skipped} tick(s) skipped so far",
                )
            k = nxt
            await asyncio.sleep(max(0.0, start + k * self.interval - time.monotonic()))

    async def poll(self) -> FleetView:
        """Scrape every endpoint once, reduce, hand to the sinks; returns the fleet view."""
        return await self._poll()

    async def flush_sinks(self, timeout: float = 10.0) -> bool:
        """Wait (at most ``timeout``) until every sink has written what it was given."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.fanout.flush, timeout)

    async def _in_stats(self, fn: Callable[..., T], *args: Any) -> T:
        """Run statistics work in the collector's worker thread (off the caller's loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _poll(
        self, before_log: Callable[[FleetView], Awaitable[Mapping[str, float]]] | None = None
    ) -> FleetView:
        """One poll; ``before_log`` (a window boundary) may add keys to the row it logs."""
        if self._poll_lock is None:
            self._poll_lock = asyncio.Lock()
        async with self._poll_lock:
            t0 = time.monotonic()
            probes = await self._version_probes()  # concurrent with the scrape, within its deadline
            scrapes = await self.source.scrape()
            if probes:
                left = max(0.0, t0 + self.timeout - time.monotonic())
                await asyncio.wait(probes, timeout=left)
            lens = self.source.max_model_len if isinstance(self.source, ModelInfoSource) else {}
            view = await self._in_stats(
                functools.partial(
                    self.pipeline.process,
                    scrapes,
                    self.source.take_departures(),
                    boundary=before_log is not None,
                    max_model_len=lens,
                )
            )
            try:
                if before_log is not None:
                    view.result.keys.update(await before_log(view))
            finally:  # the poll is logged even if the boundary failed
                self._publish(view, t0)
            return view

    def _publish(self, view: FleetView, t0: float) -> None:
        """A finished poll: the collector's own keys, the sinks, ``on_poll``."""
        self.last = view
        self._poll_seconds = time.monotonic() - t0
        view.result.keys.update(self._collector_keys())
        self.fanout.poll(view.result)
        if self.on_poll is not None:
            try:
                self.on_poll(view)
            except Exception as e:
                self._warner.warn("on_poll", f"on_poll callback raised {e!r}")

    def _collector_keys(self) -> dict[str, float]:
        """The collector's own load: poll duration, skipped ticks, rows dropped per sink."""
        p = f"{self._prefix}/collector/"
        out = {
            p + "poll_seconds": self._poll_seconds,
            p + "ticks_skipped_total": float(self._ticks_skipped),
        }
        for name, n in self.fanout.dropped().items():
            out[f"{p}sink_rows_dropped/{name}"] = float(n)
        return out
