"""The poll loop: scrape every endpoint, fold into the fleet state, reduce, log to sinks.

``Collector`` is asyncio-native (``async with Collector(...)``, ``await collector.poll()``);
``Collector.start_background()`` runs it in its own thread for synchronous trainers. Nothing in
it raises into the caller's loop: failures become metrics and rate-limited warnings.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from fleetscope._warn import RateLimitedWarner
from fleetscope.fleet import FleetState, PollResult, ScrapeResult, endpoint_of
from fleetscope.health import HealthMonitor, HealthThresholds, health_keys
from fleetscope.keys import KeyOptions, Schema, interval_keys, skyrl_interval_keys
from fleetscope.sinks.base import Sink
from fleetscope.sources.http import Endpoint, HttpSource, name_endpoints
from fleetscope.stats.deltas import EngineDelta
from fleetscope.stats.reduce import Role
from fleetscope.windows import COMBINED, Accumulator, Window, WindowError, WindowSet

log = logging.getLogger("fleetscope")


# vLLM's KV-consumer gauge: present on servers that fetch KV from a prefill server (decode)
KV_CONSUMER_FAMILY = "vllm:num_requests_kv_fetch_by_stage"


class ScrapeSource(Protocol):
    """Anything that yields one poll's scrapes: Ray agents, a Prometheus server, ..."""

    async def scrape_all(self) -> list[ScrapeResult]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine's load, for admission control. Missing values are None, never 0."""

    engine_id: str
    endpoint: str
    role: Role | None
    reporting: bool
    kv_usage: float | None
    running: float | None
    waiting: float | None
    waiting_for_capacity: float | None
    preemptions_since_last_poll: float | None
    kv_capacity_tokens: float | None
    max_model_len: int | None


@dataclass(frozen=True, slots=True)
class FleetView:
    """The typed state of the fleet after one poll (what ``on_poll`` receives)."""

    step: int
    wall_time: float
    engines: Mapping[str, EngineLoad]
    endpoints_reporting: int
    endpoints_expected: int
    keys: Mapping[str, float]
    result: PollResult


PREEMPTIONS = "vllm:num_preemptions"


def counter_increase(delta: EngineDelta | None, family: str) -> float | None:
    """The exact increase of a counter family (all its children) in one engine delta."""
    if delta is None or delta.baseline_only:
        return None
    slots = [c.slot for c in delta.layout.counters if c.name == family]
    if not slots:
        return None
    v = float(delta.delta[slots].sum())
    return None if math.isnan(v) else v


def _kv_consumer(expo) -> bool:
    return KV_CONSUMER_FAMILY in expo.types or any(
        g.name == KV_CONSUMER_FAMILY for s in expo.values() for g in s.layout.gauges
    )


def endpoint_left(
    name: str,
    state: FleetState,
    source: HttpSource,
    windows: WindowSet,
    scrape_times: dict[str, float],
    role_checked: set[str],
) -> None:
    """An endpoint left the fleet: open windows expect it up to its last scrape; its
    baselines, parser and cached facts are dropped."""
    last = scrape_times.pop(name, None)
    if last is not None:
        windows.endpoint_leaves(name, last)
    state.forget_endpoint(name)
    source.forget(name)
    role_checked.discard(name)


def note_scrapes(
    scrapes: Sequence[ScrapeResult],
    scrape_times: dict[str, float],
    joined: set[str],
    windows: WindowSet,
) -> None:
    """Each endpoint's latest scrape time; open windows expect a just-added endpoint from its
    first scrape."""
    for sc in scrapes:
        scrape_times[sc.endpoint] = sc.time
        if sc.endpoint in joined:
            windows.endpoint_joins(sc.endpoint, sc.time)


async def fetch_model_info(
    source: HttpSource, endpoints: Sequence[Endpoint], scrapes: Sequence[ScrapeResult]
) -> None:
    """``max_model_len`` of endpoints that answered and are not known yet (``/v1/models``),
    into ``source.max_model_len``."""
    need = [
        e
        for e, s in zip(endpoints, scrapes, strict=True)
        if s.ok and source.max_model_len.get(e.name) is None
    ]
    if need:
        await asyncio.gather(*(source.fetch_max_model_len(e) for e in need))


async def discover_roles(
    source: HttpSource,
    endpoints: list[Endpoint],
    scrapes: list[ScrapeResult],
    checked: set[str],
) -> list[ScrapeResult]:
    """Roles of endpoints given without one: ``GET /get_metrics_worker_info`` (SkyRL's
    protocol), else a KV-consumer gauge marks a decode server. Asked once per endpoint (names
    in ``checked``); a discovered role replaces the endpoint in ``endpoints`` and is set on
    its scrape."""
    todo = [
        (i, e)
        for i, (e, sc) in enumerate(zip(endpoints, scrapes, strict=True))
        if sc.ok and e.name not in checked
    ]
    if not todo:
        return scrapes
    infos = await asyncio.gather(*(source.fetch_worker_info(e) for _, e in todo))
    out = list(scrapes)
    for (i, ep), info in zip(todo, infos, strict=True):
        checked.add(ep.name)
        role = info.get("role") if info else None
        expo = scrapes[i].exposition
        if role not in ("prefill", "decode") and expo is not None and _kv_consumer(expo):
            role = "decode"
        if role in ("prefill", "decode"):
            endpoints[i] = Endpoint(ep.url, ep.name, role, ep.headers, ep.groups)
            out[i] = dataclasses.replace(scrapes[i], role=role)
            log.info("fleetscope: %s discovered as a %s server", ep.name, role)
    return out


def _get(metrics: Mapping[str, float], name: str) -> float | None:
    v = metrics.get(name)
    return None if v is None or math.isnan(v) else v


class Collector:
    """Watches a fleet of vLLM endpoints and logs correct fleet statistics every poll.

    Args:
        endpoints: base URLs or :class:`Endpoint` objects (names ``server0``... are assigned
            in order, per role).
        interval: seconds between polls; the schedule does not drift by the poll's duration.
        sinks: where keys go (W&B, JSONL, terminal, ...).
        on_poll: called with a :class:`FleetView` after every poll (exceptions are logged).
        timeout, max_concurrency, max_body_bytes, headers, verify: HTTP behaviour.
        schema: ``"prime-rl"`` (default keys) or ``"skyrl"``.
    """

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint] = (),
        *,
        source: ScrapeSource | None = None,
        interval: float = 5.0,
        sinks: Sequence[Sink] = (),
        on_poll: Callable[[FleetView], None] | None = None,
        timeout: float = 5.0,
        max_concurrency: int = 64,
        max_body_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
        schema: Schema = "prime-rl",
        key_budget: int | None = None,
        fetch_model_info: bool = True,
        discover_roles: bool = True,
        health_thresholds: HealthThresholds | None = None,
        group_by_model: bool = False,
    ):
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.endpoints = name_endpoints(endpoints)
        # add_endpoints / remove_endpoints may be called from any thread; they apply at the
        # start of the next poll, so a poll never sees the list change under it
        self._names_used: set[str] = {e.name for e in self.endpoints}
        self._pending_lock = threading.RLock()
        self._pending_add: list[Endpoint] = []
        self._pending_remove: list[str] = []
        self._scrape_times: dict[str, float] = {}  # endpoint -> time of its last scrape
        self.timeout = timeout
        self.interval = interval
        self.sinks = list(sinks)
        self.on_poll = on_poll
        kw = {"max_body_bytes": max_body_bytes} if max_body_bytes else {}
        self.source = HttpSource(
            timeout=timeout,
            max_concurrency=max_concurrency,
            headers=headers,
            verify=verify,
            **kw,
        )
        # another source (Ray agents, a Prometheus server) replaces direct HTTP scraping
        self.extra_source = source
        opts = KeyOptions(schema=schema, **({"key_budget": key_budget} if key_budget else {}))
        self.state = FleetState(key_options=opts, group_by_model=group_by_model)
        self.windows = WindowSet()
        self.health = HealthMonitor(health_thresholds or HealthThresholds())
        self.run_status = "running"
        self._summary_published = False
        self.fetch_model_info = fetch_model_info
        self.discover_roles = discover_roles
        self._role_checked: set[str] = {e.name for e in self.endpoints if e.role}
        self.last: FleetView | None = None
        self._task: asyncio.Task | None = None
        self._poll_lock = asyncio.Lock()
        self._sink_pool = ThreadPoolExecutor(1, thread_name_prefix="fleetscope-sinks")
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

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
        Everything is bounded by ``timeout``; nothing here raises.
        """
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if not self._closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._finish(status or "success"), timeout=timeout)
        await self.source.aclose()
        if self.extra_source is not None:
            with contextlib.suppress(Exception):
                await self.extra_source.aclose()
        if not self._closed:
            self._closed = True
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(self._sink_pool, self._close_sinks)
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(fut, timeout=30)
            self._sink_pool.shutdown(wait=False)

    def start_background(self) -> Collector:
        """Run the collector in a daemon thread with its own event loop (sync trainers)."""
        if self._thread is not None:
            return self
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._poll_lock = asyncio.Lock()
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name="fleetscope", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop_background(self, timeout: float = 30.0) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._thread = None

    def poll_blocking(self, timeout: float = 60.0) -> FleetView | None:
        """From another thread: run one poll now on the background loop and wait for it."""
        if self._loop is None:
            raise RuntimeError("poll_blocking() needs start_background() first")
        fut = asyncio.run_coroutine_threadsafe(self.poll(), self._loop)
        return fut.result(timeout)

    # ------------------------------------------------------------------ fleet changes

    def add_endpoints(self, *endpoints: str | Endpoint) -> list[Endpoint]:
        """Watch more endpoints from the next poll on (thread-safe). Unnamed ones get the next
        free name (names are never reused within a collector); returns them, named. Open
        windows expect an added endpoint's engines from its first scrape."""
        with self._pending_lock:
            watched = set(self._watched())
            for e in endpoints:
                url = e.url if isinstance(e, Endpoint) else e
                if url in watched:
                    raise ValueError(f"{url} is already watched")
                watched.add(url)
            named = name_endpoints(endpoints, taken=self._names_used)
            self._names_used.update(e.name for e in named)
            self._pending_add.extend(named)
        return named

    def remove_endpoints(self, *endpoints: str | Endpoint) -> list[str]:
        """Stop watching endpoints (by name, URL or :class:`Endpoint`) from the next poll on
        (thread-safe); returns the names removed. Their baselines are dropped (a later
        ``add_endpoints`` of the same server starts afresh); open windows keep what they
        summed and expect their engines only up to their last scrape."""
        wanted = {e.name if isinstance(e, Endpoint) else e for e in endpoints}
        with self._pending_lock:
            keep = [e for e in self._pending_add if not ({e.name, e.url} & wanted)]
            names = [e.name for e in self._pending_add if e not in keep]
            self._pending_add = keep
            for e in self.endpoints:
                if {e.name, e.url} & wanted and e.name not in self._pending_remove:
                    self._pending_remove.append(e.name)
                    names.append(e.name)
        return names

    def set_endpoints(
        self, endpoints: Sequence[str | Endpoint]
    ) -> tuple[list[Endpoint], list[str]]:
        """Make the watched fleet exactly ``endpoints`` from the next poll on (service
        discovery, an endpoints file): endpoints are matched by URL; a URL whose role changed
        is removed and added again. Returns ``(added, removed names)``."""
        wanted = {}
        for e in endpoints:
            ep = e if isinstance(e, Endpoint) else Endpoint(url=e)
            if ep.url in wanted:
                raise ValueError(f"{ep.url} is listed twice")
            wanted[ep.url] = ep
        with self._pending_lock:
            current = self._watched()
            gone = [
                e.name
                for url, e in current.items()
                if url not in wanted or (wanted[url].role or e.role) != e.role
            ]
            removed = self.remove_endpoints(*gone) if gone else []
            new = [
                ep for url, ep in wanted.items() if url not in current or current[url].name in gone
            ]
            added = self.add_endpoints(*new) if new else []
        return added, removed

    def _watched(self) -> dict[str, Endpoint]:
        """URL -> endpoint of the fleet as the next poll will see it (pending changes in);
        call with ``_pending_lock`` held."""
        return {
            e.url: e
            for e in [*self.endpoints, *self._pending_add]
            if e.name not in self._pending_remove
        }

    def _take_fleet_changes(self) -> tuple[list[Endpoint], list[str]]:
        """At the start of a poll: the pending additions and removals, applied to
        ``self.endpoints``; returns ``(added, removed names)``."""
        with self._pending_lock:
            added, self._pending_add = self._pending_add, []
            removed, self._pending_remove = self._pending_remove, []
        for name in removed:
            self.endpoints = [e for e in self.endpoints if e.name != name]
            log.info("fleetscope: %s removed from the fleet", name)
        for ep in added:
            self.endpoints.append(ep)
            log.info("fleetscope: %s (%s) added to the fleet", ep.name, ep.url)
        return added, removed

    def _apply_fleet_changes(self) -> list[Endpoint]:
        """Take the pending changes and forget what removed endpoints leave behind."""
        added, removed = self._take_fleet_changes()
        for name in removed:
            endpoint_left(
                name, self.state, self.source, self.windows, self._scrape_times, self._role_checked
            )
        self._role_checked.update(ep.name for ep in added if ep.role)
        return added

    # ------------------------------------------------------------------ windows

    def window(self, label: str) -> WindowHandle:
        """A named window (``train``, ``eval``...): ``with``/``async with``, or explicit
        ``start / pause / resume / stop``. Every boundary takes a poll first."""
        return WindowHandle(self, label)

    async def _boundary(self, action: str, label: str) -> dict[str, float]:
        self.windows.check(action, label)  # misuse raises before anything is scraped
        keys: dict[str, float] = {}

        async def at_boundary(view: FleetView) -> Mapping[str, float]:
            now = view.result.time
            # each engine's own scrape time at this boundary: coverage is judged per engine
            times = {i.engine_id: i.delta.current.time for i in view.result.inputs if i.is_engine}
            w = await self._window_action(action, label, now, times)
            if action == "stop":
                keys.update(self._interval_keys(w.acc, label, summary=False))
            return keys

        # the window's keys go out in the same row as the boundary poll's
        await self._poll(at_boundary)
        if action in ("start", "stop") and self.sinks:
            # sinks that mark windows (Grafana annotation regions) hear of it once it is logged
            hook = "on_window_start" if action == "start" else "on_window_stop"
            await asyncio.get_running_loop().run_in_executor(
                self._sink_pool, self._notify_sinks, hook, label
            )
        return keys

    async def _window_action(
        self, action: str, label: str, now: float, times: Mapping[str, float]
    ) -> Window:
        """Apply a boundary to the windows (a sharded driver also has its shards do it)."""
        return getattr(self.windows, action)(label, now, times)

    async def _close_windows(self) -> None:
        """At the end of the run: stop every window still open or paused."""
        self.windows.stop_all(time.monotonic())

    def _interval_keys(self, acc: Accumulator, label: str, *, summary: bool) -> dict[str, float]:
        stats = acc.stats()
        if stats is None:
            return {}
        meta = {
            "active_seconds": acc.active_seconds,
            "coverage": acc.coverage(),
            "polls": float(acc.polls),
            "failed_scrapes": float(acc.failed_scrapes),
            "engine_restarts": float(acc.engine_restarts),
        }
        opts = self.state.key_options
        if opts.schema == "skyrl":
            base = ("vllm_correct_aggregate" if summary else (opts.prefix or "vllm")) + "/" + label
            return skyrl_interval_keys(stats, base, meta, summary=summary)
        root = (opts.prefix or "inference") + ("_summary" if summary else "")
        return interval_keys(stats, f"{root}/{label}", meta)

    def summary(self) -> dict[str, float | str]:
        """The run summary: per run label (each window label, ``idle`` between windows, and
        ``combined`` = the whole run), exact totals, rates, pooled means and quantiles."""
        return self._summary_of(self.windows.run)

    async def asummary(self) -> dict[str, float | str]:
        """:meth:`summary` for async code (a sharded collector asks its shards without
        blocking the event loop)."""
        return self.summary()

    def _summary_of(self, run: Mapping[str, Accumulator]) -> dict[str, float | str]:
        out: dict[str, float | str] = {}
        for label, acc in run.items():
            if label == COMBINED or acc.polls:
                out.update(self._interval_keys(acc, label, summary=True))
        out["run_status"] = self.run_status
        return out

    def state_dict(self) -> dict:
        """What a checkpoint needs to continue the same run summary after a restart."""
        return {
            "windows": self.windows.state_dict(),
            "restarts": dict(self.state.restarts),
            "scrape_failures_total": dict(self.state.scrape_failures_total),
            "step": self.state.step,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Continue a saved run summary. Baselines are taken afresh: only what happens from
        now on is counted on top of the saved sums."""
        self.windows.load_state_dict(state["windows"])
        self.state.restarts.update(state.get("restarts", {}))
        self.state.scrape_failures_total.update(state.get("scrape_failures_total", {}))
        self.state.step = max(self.state.step, int(state.get("step", 0)))

    async def _finish(self, status: str) -> None:
        if self._summary_published:
            return
        self._summary_published = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.poll(), timeout=self.timeout * 2)
        await self._close_windows()
        if self.run_status == "running":
            self.run_status = status
        summary = self.summary()
        if self.sinks:
            await asyncio.get_running_loop().run_in_executor(
                self._sink_pool, self._log_summary, summary
            )

    def _notify_sinks(self, hook: str, label: str) -> None:
        for sink in self.sinks:
            fn = getattr(sink, hook, None)
            if fn is None:
                continue
            try:
                fn(label)
            except Exception as e:
                self._warner.warn(f"sink-{hook}", f"{hook} of {sink!r} failed: {e!r}")

    def _log_summary(self, summary: Mapping[str, float | str]) -> None:
        for sink in self.sinks:
            try:
                sink.log_summary(summary)
            except Exception as e:
                self._warner.warn("sink-summary", f"summary to {sink!r} failed: {e!r}")

    def _run_sync(self, coro_fn, *args):
        """Run a collector coroutine from synchronous code (the background loop)."""
        if self._loop is None:
            self.start_background()
        assert self._loop is not None
        if threading.current_thread() is self._thread:
            raise WindowError("inside the collector's own loop, use the async methods")
        return asyncio.run_coroutine_threadsafe(coro_fn(*args), self._loop).result(120)

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
            # next tick on a fixed grid: no drift; skip ticks a slow poll overran
            k = max(k + 1, math.floor((time.monotonic() - start) / self.interval) + 1)
            await asyncio.sleep(max(0.0, start + k * self.interval - time.monotonic()))

    async def _collect(self) -> PollResult:
        """Scrape every endpoint once and reduce (the part a sharded collector replaces)."""
        added = {e.name for e in self._apply_fleet_changes()}
        scrapes = await self.source.scrape_all(self.endpoints) if self.endpoints else []
        note_scrapes(scrapes, self._scrape_times, added, self.windows)
        if self.discover_roles:
            scrapes = await self._discover_roles(scrapes)
        if self.extra_source is not None:
            # engines the source gave up last poll (a restarted Ray actor's old worker): their
            # last poll is folded, so forget them before this one
            take_retired = getattr(self.extra_source, "take_retired", None)
            for engine_id in take_retired() if take_retired else ():
                last = self.state.baselines.last(engine_id)
                if last is not None:
                    self.windows.engine_leaves(engine_id, last.time)
                self.state.forget_engine(engine_id)
            scrapes += await self.extra_source.scrape_all()
        if self.fetch_model_info:
            # direct endpoints only: a source's scrapes (Ray agents) come after them
            await fetch_model_info(self.source, self.endpoints, scrapes[: len(self.endpoints)])
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.source._pool, self.state.observe, scrapes)

    async def poll(self) -> FleetView:
        """Scrape every endpoint once, reduce, log to the sinks; returns the fleet view."""
        return await self._poll()

    async def _poll(
        self, before_log: Callable[[FleetView], Awaitable[Mapping[str, float]]] | None = None
    ) -> FleetView:
        """One poll; ``before_log`` (a window boundary) may add keys to the row it logs."""
        async with self._poll_lock:
            loop = asyncio.get_running_loop()
            result = await self._collect()
            # windows, health and the typed view walk every engine: off the loop, like parsing
            view = await loop.run_in_executor(self.source._pool, self._after_poll, result)
            self.last = view
            try:
                if before_log is not None:
                    result.keys.update(await before_log(view))
            finally:  # the poll is logged even if the boundary failed
                if self.sinks:
                    await loop.run_in_executor(self._sink_pool, self._log_sinks, result)
            if self.on_poll is not None:
                try:
                    self.on_poll(view)
                except Exception as e:
                    self._warner.warn("on_poll", f"on_poll callback raised {e!r}")
            return view

    def _after_poll(self, result: PollResult) -> FleetView:
        """Attribute the poll to windows, evaluate health, build the fleet view (a thread)."""
        scrapes = result.scrapes
        self.windows.attribute(
            result.inputs,
            now=result.time,
            failed_scrapes=sum(1 for sc in scrapes if not sc.ok),
        )
        # per-row roles travel with the statistics (a sharded driver has no inputs)
        stats = result.stats
        roles = dict(zip(stats.engine_ids, stats.roles, strict=False)) or dict(
            self.state.engine_role
        )
        result.events = self.health.evaluate(result, roles)
        prefix = self.state.key_options.prefix or (
            "vllm" if self.state.key_options.schema == "skyrl" else "inference"
        )
        result.keys.update(health_keys(result.events, prefix))
        for ev in result.events:
            if ev.condition != "scrape_failed":  # the source already warned, naming it
                self._warner.warn(f"health:{ev.condition}:{ev.subject}", f"health: {ev.message}")
        return self._view(result)

    async def _discover_roles(self, scrapes: list[ScrapeResult]) -> list[ScrapeResult]:
        return await discover_roles(self.source, self.endpoints, scrapes, self._role_checked)

    def _known_engines(self) -> Iterable[str]:
        """Every engine id with a baseline (seen before, and not forgotten)."""
        return self.state.baselines.engines()

    def _view(self, result: PollResult) -> FleetView:
        stats = result.stats
        engines: dict[str, EngineLoad] = {}
        for i, eid in enumerate(stats.engine_ids):
            if not stats.is_engine[i]:
                continue
            m = stats.engine(eid)
            endpoint = endpoint_of(eid)
            engines[eid] = EngineLoad(
                engine_id=eid,
                endpoint=endpoint,
                role=self.state.engine_role.get(eid, self.state.roles.get(endpoint)),
                reporting=True,
                kv_usage=_get(m, "kv_cache_usage_perc"),
                running=_get(m, "num_requests_running"),
                waiting=_get(m, "num_requests_waiting"),
                waiting_for_capacity=_get(m, "num_requests_waiting_reason_capacity"),
                preemptions_since_last_poll=(
                    counter_increase(result.deltas.get(eid), PREEMPTIONS)
                    if eid in result.deltas
                    else result.preemptions.get(eid)
                ),
                kv_capacity_tokens=_get(m, "kv_cache_capacity_tokens"),
                max_model_len=self.source.max_model_len.get(endpoint),
            )
        # engines seen before but silent this poll: listed, with nothing known
        for eid in self._known_engines():
            endpoint = endpoint_of(eid)
            if eid not in engines and "." in eid:
                engines[eid] = EngineLoad(
                    eid,
                    endpoint,
                    self.state.roles.get(endpoint),
                    False,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    self.source.max_model_len.get(endpoint),
                )
        return FleetView(
            step=result.step,
            wall_time=result.wall_time,
            engines=engines,
            endpoints_reporting=sum(1 for s in result.scrapes if s.ok),
            endpoints_expected=len(result.scrapes),
            keys=result.keys,
            result=result,
        )

    def _log_sinks(self, result: PollResult) -> None:
        for sink in self.sinks:
            try:
                log_poll = getattr(sink, "log_poll", None)
                if log_poll is not None:  # sinks that draw the fleet want the statistics
                    log_poll(result)
                else:
                    sink.log(result.keys, step=result.step, wall_time=result.wall_time)
                log_events = getattr(sink, "log_events", None)
                if log_events is not None and result.events:
                    log_events(result.events)
            except Exception as e:
                self._warner.warn(f"sink:{type(sink).__name__}", f"sink {sink!r} failed: {e!r}")

    def _close_sinks(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:
                self._warner.warn("sink-close", f"closing {sink!r} failed: {e!r}")


class WindowHandle:
    """Controls one window. Sync methods need ``start_background()`` (started on demand);
    async ones (``astart`` ...) run on the caller's loop."""

    def __init__(self, collector: Collector, label: str):
        self.collector = collector
        self.label = label
        self.keys: dict[str, float] = {}

    async def astart(self) -> WindowHandle:
        await self.collector._boundary("start", self.label)
        return self

    async def apause(self) -> None:
        await self.collector._boundary("pause", self.label)

    async def aresume(self) -> None:
        await self.collector._boundary("resume", self.label)

    async def astop(self) -> dict[str, float]:
        self.keys = await self.collector._boundary("stop", self.label)
        return self.keys

    def start(self) -> WindowHandle:
        self.collector._run_sync(self.collector._boundary, "start", self.label)
        return self

    def pause(self) -> None:
        self.collector._run_sync(self.collector._boundary, "pause", self.label)

    def resume(self) -> None:
        self.collector._run_sync(self.collector._boundary, "resume", self.label)

    def stop(self) -> dict[str, float]:
        self.keys = self.collector._run_sync(self.collector._boundary, "stop", self.label)
        return self.keys

    def __enter__(self) -> WindowHandle:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> WindowHandle:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()
