"""The poll loop: a source's scrapes -> fleet state -> windows, health, view -> sinks.

``Collector`` is asyncio-native (``async with Collector(...)``, ``await collector.poll()``);
``Collector.start_background()`` runs it in its own thread for synchronous trainers. Nothing in
it raises into the caller's loop: failures become metrics and rate-limited warnings. Every
public method may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleetscope.collector import process
from fleetscope.collector.backend import Backend
from fleetscope.collector.boundaries import Boundaries
from fleetscope.collector.handles import WindowHandle
from fleetscope.collector.inline import InlineBackend
from fleetscope.collector.loop import LoopThread
from fleetscope.fleet.config import CollectorConfig
from fleetscope.fleet.pipeline import PollPipeline
from fleetscope.fleet.state import FleetState
from fleetscope.fleet.view import EngineLoad, FleetView
from fleetscope.health import HealthMonitor
from fleetscope.keys import key_prefix
from fleetscope.rl.states import EngineStates
from fleetscope.rl.versions import PolicyVersions
from fleetscope.rl.weight_sync import WeightSyncHandle, WeightSyncs
from fleetscope.sinks.base import Sink
from fleetscope.sinks.fanout import SinkFanout
from fleetscope.sources.base import MembershipSource, Source
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.stats.windows import WindowError, WindowSet
from fleetscope.util.warn import RateLimitedWarner

__all__ = ["Collector", "EngineLoad", "FleetView", "WindowError", "WindowHandle"]

log = logging.getLogger("fleetscope")


class Collector:
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

    The work of a poll is done by its ``backend``: in this process, or (``isolation="process"``,
    or ``"auto"`` from 256 endpoints) in a supervised child process (:mod:`.process`).
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
        cfg = self.config = (config or CollectorConfig()).with_options(**options)
        if source is not None and endpoints:
            raise ValueError("give endpoints (scraped over HTTP) or a source, not both")
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")
        in_child = source is None and process.wants_process(
            endpoints, {**options, "config": config}
        )
        self.backend: Backend = self.make_backend(endpoints, source, cfg, in_child=in_child)
        self.source: Source = self.backend.source
        self.interval = cfg.interval
        self.timeout = cfg.timeout
        self.on_poll = on_poll
        self.fanout = SinkFanout(sinks, queue_size=cfg.sink_queue)
        self.run_status = "running"
        self.last: FleetView | None = None
        self._prefix = key_prefix(cfg.key_options)
        self._background = LoopThread(self.start, self.stop, self._warner)
        self.boundaries = Boundaries(self.backend, self.fanout, self._background, cfg.boundary_wait)
        self._task: asyncio.Task[None] | None = None
        self._scheduled = False  # the loop was started: rows follow its interval
        self._summary_published = False
        self._closed = False
        self._ticks_skipped = 0
        self._poll_seconds = 0.0

    def make_backend(
        self,
        endpoints: Sequence[str | Endpoint],
        source: Source | None,
        config: CollectorConfig,
        *,
        in_child: bool,
    ) -> Backend:
        """Where this collector's polls run: ``in_child`` (``isolation="process"``, or
        ``"auto"`` from 256 endpoints) a supervised child process, else this process. A
        subclass with its own source (``ShardedCollector``) builds its own."""
        if in_child:
            return process.ProcessBackend(endpoints, config, self._publish, self._warner)
        source = source or HttpSource(endpoints, **config.http_options())
        return InlineBackend(source, config, self._publish)

    # ------------------------------------------------------------------ in-process statistics

    @property
    def pipeline(self) -> PollPipeline:
        """The statistics of an in-process collector (``isolation="process"``: in the child)."""
        if not isinstance(self.backend, InlineBackend):
            raise AttributeError("pipeline: with isolation='process' it is in the child process")
        return self.backend.pipeline

    @property
    def state(self) -> FleetState:
        return self.pipeline.state

    @property
    def windows(self) -> WindowSet:
        return self.pipeline.windows

    @property
    def health(self) -> HealthMonitor:
        return self.pipeline.health

    @property
    def versions(self) -> PolicyVersions:
        return self.pipeline.versions

    @property
    def syncs(self) -> WeightSyncs:
        return self.pipeline.syncs

    @property
    def states(self) -> EngineStates:
        return self.pipeline.states

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

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the backend is up: ``isolation="process"``'s child process (its start-up
        is otherwise in the first poll); at once in-process."""
        await self.backend.wait_ready(timeout)

    async def start(self) -> None:
        """Start polling in the background of the running event loop."""
        if self._task is None:
            self._scheduled = True
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
        await self.backend.aclose(self.run_status)
        if not self._closed:
            self._closed = True
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(None, self.fanout.close, self.config.close_timeout)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(fut, timeout=self.config.close_timeout + 1)

    def start_background(self) -> Collector:
        """Run the collector in a daemon thread with its own event loop (sync trainers)."""
        self._background.start()
        return self

    def stop_background(self, timeout: float = 60.0) -> None:
        """Stop the background thread: last poll, run summary, sinks closed (bounded)."""
        self._background.stop(timeout)

    def poll_blocking(self, timeout: float = 60.0) -> FleetView | None:
        """From another thread: run one poll now on the background loop and wait for it."""
        loop = self._background.loop
        if loop is None:
            raise RuntimeError("poll_blocking() needs start_background() first")
        return asyncio.run_coroutine_threadsafe(self.poll(), loop).result(timeout)

    # ------------------------------------------------------------------ windows and RL

    def window(self, label: str) -> WindowHandle:
        """A named window (``train``, ``eval``...): ``with``/``async with``, or explicit
        ``start / pause / resume / stop``. Every boundary takes a poll first."""
        return WindowHandle(self.boundaries, label)

    def weight_sync(self, version: str) -> WeightSyncHandle:
        """Bracket a weight sync: ``with`` / ``async with``; a poll at entry and at exit, then
        ``version`` is the policy version (docs/rl-lifecycle.md)."""
        return WeightSyncHandle(self.boundaries, version)

    def set_policy_version(self, version: str) -> None:
        """The trainer's policy is now ``version`` (any thread): from the next poll on, each
        endpoint's ``/weight_info`` is compared with it (docs/rl-lifecycle.md)."""
        self.backend.set_policy_version(version)

    @property
    def policy_version(self) -> str | None:
        """The trainer's policy version as last announced (None before the first)."""
        return self.backend.policy_version

    # ------------------------------------------------------------------ summary and state

    def summary(self) -> dict[str, float | str]:
        """The run summary: per run label (each window label, ``idle`` between windows, and
        ``combined`` = the whole run), exact totals, rates, pooled means and quantiles."""
        return self.backend.summary(self.run_status)

    async def asummary(self) -> dict[str, float | str]:
        """:meth:`summary` without blocking the event loop."""
        return await self.backend.asummary(self.run_status)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue the same run summary after a restart (plain
        data: JSON-able; open windows included)."""
        return self.backend.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue a saved run summary. Baselines are taken afresh: only what happens from
        now on is counted on top of the saved sums."""
        self.boundaries.ledger.reset(*self.backend.load_state_dict(state))

    async def _finish(self, status: str) -> None:
        if self._summary_published:
            return
        self._summary_published = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.poll(), timeout=self.timeout * 2)
        await self.backend.close_windows(time.monotonic())
        if self.run_status == "running":
            self.run_status = status
        self.fanout.summary(await self.asummary())
        self.fanout.run_end(self.run_status)

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
        """Scrape every endpoint once, reduce, hand to the sinks; returns the fleet view.

        While the collector's own loop runs (and for its final poll at stop), a poll less
        than half an interval after the previous row that showed rates (a manual ``poll()``,
        the final poll) shows instant values only: the next row shows its increases over the
        whole interval (docs/rules.md §3.9). Polls of a collector that is not started are
        the caller's own schedule: every row shows its rates."""
        floor = self.interval / 2 if self._scheduled else 0.0
        return await self.backend.poll(row_floor=floor)

    async def flush_sinks(self, timeout: float = 10.0) -> bool:
        """Wait (at most ``timeout``) until every sink has written what it was given."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.fanout.flush, timeout)

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
        out.update(self.backend.collector_keys(self._prefix))
        return out
