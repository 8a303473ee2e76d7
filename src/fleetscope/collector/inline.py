"""``isolation="inline"``: a collector's polls in this process (the default below 256 endpoints).

The source scrapes on the caller's event loop; the statistics (deltas, reductions, windows,
health, keys: :class:`~fleetscope.fleet.pipeline.PollPipeline`) run in one worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar, runtime_checkable

from fleetscope.collector.backend import Publish
from fleetscope.collector.rl import InlineRL
from fleetscope.fleet.config import CollectorConfig
from fleetscope.fleet.pipeline import PollPipeline
from fleetscope.fleet.report import accumulator_keys
from fleetscope.fleet.view import FleetView
from fleetscope.keys import KeyDict, key_prefix
from fleetscope.sources.base import MembershipSource, ModelInfoSource, Source

T = TypeVar("T")
BeforeLog = Callable[[FleetView], Awaitable[Mapping[str, float]]]


@runtime_checkable
class ReadySource(Protocol):
    """A source with workers to start (``Collector.wait_ready`` waits for them)."""

    async def wait_ready(self, timeout: float) -> None: ...


@runtime_checkable
class KeyedSource(Protocol):
    """A source with keys of its own in every row (``{prefix}/collector/...``)."""

    def collector_keys(self, prefix: str) -> dict[str, float]: ...


class InlineBackend:
    """Scrapes with ``source`` and computes with a :class:`PollPipeline`, one poll at a time."""

    def __init__(self, source: Source, config: CollectorConfig, publish: Publish):
        self.source = source
        self.config = config
        self.pipeline = PollPipeline(config)
        self.rl = InlineRL(self.pipeline, config)  # policy versions, engine states, syncs
        self._publish = publish
        self._prefix = key_prefix(config.key_options)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fleetscope-stats")
        self._lock: asyncio.Lock | None = None

    async def wait_ready(self, timeout: float) -> None:
        """At once, unless the source has workers to wait for (a sharded source's actors)."""
        if isinstance(self.source, ReadySource):
            await self.source.wait_ready(timeout)

    # ------------------------------------------------------------------ polls and boundaries

    async def _in_stats(self, fn: Callable[..., T], *args: Any) -> T:
        """Run statistics work in the worker thread (off the caller's loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def poll(
        self, before_log: BeforeLog | None = None, *, row_floor: float = 0.0
    ) -> FleetView:
        """One poll; ``before_log`` (a boundary) may add keys to the row it logs; a row
        sooner than ``row_floor`` after the last row that showed rates is held."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            t0 = time.monotonic()
            src = self.source
            endpoints = list(src.endpoints) if isinstance(src, MembershipSource) else []
            probes = await self.rl.probes(endpoints)  # concurrent with the scrape, in its deadline
            scrapes = await src.scrape()
            if probes:
                left = max(0.0, t0 + self.config.timeout - time.monotonic())
                await asyncio.wait(probes, timeout=left)
            lens = src.max_model_len if isinstance(src, ModelInfoSource) else {}
            view = await self._in_stats(
                functools.partial(
                    self.pipeline.process,
                    scrapes,
                    src.take_departures(),
                    boundary=before_log is not None,
                    row_floor=row_floor,
                    max_model_len=lens,
                )
            )
            try:
                if before_log is not None:
                    view.result.keys.update(await before_log(view))
            finally:  # the poll is logged even if the boundary failed
                self._publish(view, t0)
            return view

    async def window(self, action: str, label: str) -> dict[str, float]:
        """A poll, then the window action at that poll's scrape times; the window's keys ride
        in the same row as the poll's."""
        keys = KeyDict()  # keeps the window keys' compact subset (KeyDict.full_only)
        pipeline = self.pipeline

        async def at_boundary(view: FleetView) -> Mapping[str, float]:
            result = view.result
            # each engine's own scrape time at this boundary: coverage is judged per engine
            times = {i.engine_id: i.delta.current.time for i in result.inputs if i.is_engine}
            w = await self._in_stats(pipeline.window_action, action, label, result.time, times)
            if action == "stop":
                with pipeline.lock:
                    options = pipeline.state.key_options
                    limits = pipeline.state.limits
                    keys.update(
                        accumulator_keys(w.acc, label, options, summary=False, limits=limits)
                    )
                    keys.update(self.rl.window_keys(label, self._prefix))
            return keys

        await self.poll(at_boundary)
        return keys

    async def sync(self, action: str, token: int, version: str, *, ok: bool) -> dict[str, float]:
        self.rl.before_sync(action, version, ok)
        keys: dict[str, float] = {}

        async def at_boundary(view: FleetView) -> Mapping[str, float]:
            t = view.result.time
            if action == "enter":
                await self._in_stats(self.rl.syncs.enter, token, version, t)
            else:
                keys.update(await self._in_stats(self.rl.sync_exit, token, t, self._prefix, ok))
            return keys

        await self.poll(at_boundary)
        return keys

    async def close_windows(self, now: float) -> None:
        await self._in_stats(self.pipeline.close_windows, now)

    # ------------------------------------------------------------------ RL

    @property
    def policy_version(self) -> str | None:
        return self.rl.policy_version

    def set_policy_version(self, version: str) -> None:
        self.rl.announce(version)

    # ------------------------------------------------------------------ summary and state

    def summary(self, status: str) -> dict[str, float | str]:
        return self.pipeline.summary(status)

    async def asummary(self, status: str) -> dict[str, float | str]:
        return await asyncio.get_running_loop().run_in_executor(None, self.summary, status)

    def state_dict(self) -> dict[str, Any]:
        return self.pipeline.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        self.pipeline.load_state_dict(state)
        windows = self.pipeline.windows
        return list(windows.active), list(windows.paused)

    def collector_keys(self, prefix: str) -> dict[str, float]:
        """The source's own keys, if it has any (a sharded source's restarts)."""
        return self.source.collector_keys(prefix) if isinstance(self.source, KeyedSource) else {}

    async def aclose(self, status: str) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.source.aclose(), timeout=5)
        await self.rl.aclose()
        self._pool.shutdown(wait=False)
