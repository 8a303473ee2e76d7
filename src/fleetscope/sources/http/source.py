"""Scraping vLLM ``/metrics`` endpoints over HTTP: concurrent, bounded, capped, timed.

The HTTP source owns the watched endpoints (add / remove / set from any thread, applied at the
next poll), each endpoint's parser, and what it learns from side requests: the role
(``GET /get_metrics_worker_info``, SkyRL's protocol, or vLLM's KV-consumer gauge) and
``max_model_len`` (``GET /v1/models``).

Every request has a total deadline and a size cap. Side requests start at an endpoint's first
successful scrape, run concurrently with the rest of the poll, and are waited for only until the
poll's own deadline: a side request that is slower keeps running in the background and its
answer applies at a later poll; one that fails is retried with backoff (30 s, doubling to 15
min). A definite answer (including 404) is never asked again. Bodies are parsed off the event
loop (a worker thread). Every failure becomes a failed :class:`ScrapeResult` plus a
rate-limited warning naming the endpoint; nothing is raised to the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import httpx

from fleetscope.catalog import KV_CONSUMER_FAMILY
from fleetscope.exposition import MAX_BODY_BYTES, Exposition, ExpositionError, Parser
from fleetscope.identity import Role
from fleetscope.sources.base import Departure, Endpoint, ScrapeResult
from fleetscope.sources.http.client import (
    ACCEPT,
    ScrapeError,
    describe,
    fetch_metrics,
    get_json,
    new_clients,
    went_away,
)
from fleetscope.sources.http.continuity import ContinuityEvidence
from fleetscope.sources.http.loop_parse import LoopParser
from fleetscope.sources.http.membership import EndpointSet, Members, name_endpoints
from fleetscope.sources.http.server_version import ServerVersions
from fleetscope.sources.http.wire import Response, WireClient
from fleetscope.util.backoff import Backoff
from fleetscope.util.warn import RateLimitedWarner

__all__ = ["ACCEPT", "Endpoint", "HttpSource", "name_endpoints"]

log = logging.getLogger("fleetscope")

# bodies up to this size, of a shape already seen, are parsed on the loop (~0.4 ms per 50 KB)
INLINE_PARSE_BYTES = 256 * 1024


@dataclass
class _Side:
    """What the side requests of one endpoint still owe, and when to try again."""

    want_role: bool
    want_models: bool
    kv_consumer: bool = False  # the body has vLLM's KV-consumer gauge (a decode server)
    backoff: Backoff = field(default_factory=Backoff)
    task: asyncio.Task[None] | None = None


class HttpSource(Members):
    """Scrapes a changing set of endpoints with one shared ``httpx.AsyncClient``."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint] = (),
        *,
        timeout: float = 5.0,
        max_concurrency: int = 64,
        max_body_bytes: int = MAX_BODY_BYTES,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
        parse_workers: int = 1,
        warn_interval: float = 60.0,
        identity_labels: Sequence[str] | None = None,
        discover_roles: bool = True,
        fetch_model_info: bool = True,
        side_timeout: float | None = None,
    ):
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.discover_roles = discover_roles
        self.fetch_model_info = fetch_model_info
        self.side_timeout = min(timeout, 5.0) if side_timeout is None else side_timeout
        self._headers = {"Accept": ACCEPT, **(headers or {})}
        self._verify = verify
        self._sem = asyncio.Semaphore(max_concurrency)
        self._loop_parser = LoopParser()
        self._client: httpx.AsyncClient | None = None  # side requests
        self._wire: WireClient | None = None  # /metrics scrapes (the hot path)
        self._client_lock = asyncio.Lock()
        self._parsers: dict[str, Parser] = {}
        self._pool = ThreadPoolExecutor(parse_workers, thread_name_prefix="fleetscope-parse")
        self._warner = RateLimitedWarner(log, interval=warn_interval, prefix="fleetscope: ")
        self._identity = identity_labels
        self.max_model_len: dict[str, int | None] = {}
        self.members = EndpointSet(endpoints)
        self._joined: set[str] = set()
        self._departures: list[Departure] = []
        self._last_time: dict[str, float] = {}  # endpoint -> its last scrape (any outcome)
        self._continuity = ContinuityEvidence()  # failures, kept connections, per endpoint
        self._side: dict[str, _Side] = {e.name: self._new_side(e) for e in self.endpoints}
        # GET /version once per endpoint, and the catalog's names checked against its body
        self.server_versions = ServerVersions(self.warn, deadline=self.side_timeout)

    # ------------------------------------------------------------------ membership

    def _apply_changes(self) -> None:
        before = self.members.endpoints
        add, remove = self.members.apply()
        for name in remove:
            self._forget(name)
        if remove and self._wire is not None:  # close their idle connections
            for e in before:
                if e.name in remove:
                    self._wire.forget(e.metrics_url)
        for e in add:
            self._joined.add(e.name)
            self._side[e.name] = self._new_side(e)

    def _forget(self, name: str) -> None:
        """An endpoint left the fleet: its parser, side requests and facts are dropped."""
        self._departures.append(Departure(endpoint=name, time=self._last_time.pop(name, None)))
        self._parsers.pop(name, None)
        self.max_model_len.pop(name, None)
        self._continuity.forget(name)
        self._joined.discard(name)
        side = self._side.pop(name, None)
        if side is not None and side.task is not None:
            side.task.cancel()
        self.server_versions.forget(name)

    def take_departures(self) -> list[Departure]:
        out, self._departures = self._departures, []
        return out

    # ------------------------------------------------------------------ lifecycle

    async def _ensure_client(self) -> httpx.AsyncClient:
        """The shared client, built off the event loop: with TLS verification on, httpx loads
        the CA bundle synchronously (0.3-0.9 s), which must not stall the caller's loop."""
        async with self._client_lock:
            if self._client is None:
                loop = asyncio.get_running_loop()
                self._client, self._wire = await loop.run_in_executor(
                    None, new_clients, self._headers, self._verify, self.timeout
                )
            assert self._client is not None
        return self._client

    async def aclose(self) -> None:
        for side in self._side.values():
            if side.task is not None:
                side.task.cancel()
        self.server_versions.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._wire is not None:
            await self._wire.aclose()
            self._wire = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop_parser.cancel()

    def warn(self, endpoint: str, kind: str, message: str) -> None:
        self._warner.warn(f"{endpoint}:{kind}", message)

    # ------------------------------------------------------------------ polling

    async def scrape(self) -> list[ScrapeResult]:
        """One poll: every watched endpoint once, side requests within the poll's deadline."""
        self._apply_changes()
        endpoints = self.endpoints
        if not endpoints:
            return []
        deadline = time.monotonic() + self.timeout
        results = list(await asyncio.gather(*(self.scrape_one(e) for e in endpoints)))
        pending = [
            t for e, r in zip(endpoints, results, strict=True) if (t := self._side_task(e, r))
        ]
        pending += self.server_versions.start(self._ensure_client, endpoints, results)
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        # roles learnt so far apply to this poll's scrapes already
        by_name = {e.name: e for e in self.endpoints}
        return [
            self.server_versions.annotate(
                r
                if r.role == by_name[r.endpoint].role
                else replace(r, role=by_name[r.endpoint].role)
            )
            for r in results
        ]

    async def scrape_all(self, endpoints: Sequence[Endpoint] | None = None) -> list[ScrapeResult]:
        """Scrape ``endpoints`` once (all watched ones when None), without side requests."""
        if endpoints is None:
            return await self.scrape()
        return list(await asyncio.gather(*(self.scrape_one(e) for e in endpoints)))

    async def scrape_one(self, ep: Endpoint) -> ScrapeResult:
        if self._client is None:
            await self._ensure_client()  # once, before (not inside) the endpoint's deadline
        async with self._sem:
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(self.timeout):  # no task per request (wait_for)
                    response = await self._fetch(ep)
            except Exception as e:
                reason = describe(e, self.timeout)
                if went_away(e):
                    self._continuity.failed(ep.name, reason)
                return self._failed(ep, t0, reason)
            t_arrived, wall = time.monotonic(), time.time()
        body = response.body
        parser = self._parsers.get(ep.name)
        if parser is None:
            parser = self._parsers[ep.name] = Parser(
                identity_labels=self._identity, max_bytes=self.max_body_bytes
            )
        try:
            if len(body) <= INLINE_PARSE_BYTES and parser.fast_hits:
                # a body of a known shape: on the loop, a slice at a time (_loop_parse.py)
                expo = await self._loop_parser.run(
                    lambda: parser.parse(body, time=t_arrived, wall_time=wall)
                )
            else:
                expo = await asyncio.get_running_loop().run_in_executor(
                    self._pool, lambda: parser.parse(body, time=t_arrived, wall_time=wall)
                )
        except ExpositionError as e:
            return self._failed(ep, t0, f"bad exposition: {e}")
        except Exception as e:
            return self._failed(ep, t0, f"parser failed: {type(e).__name__}: {e}")
        doubt = self._continuity.succeeded(ep.name, response.kept_idle, response.dropped_idle)
        return ScrapeResult(
            ep.name,
            expo,
            t_arrived,
            wall,
            latency=t_arrived - t0,
            role=ep.role,
            groups=ep.groups,
            # roles the body reports (SGLang's engine_type); an explicit endpoint role wins
            engine_roles=expo.engine_roles if ep.role is None else {},
            joined=self._take_joined(ep.name, t_arrived),
            continuity_doubt=doubt,
        )

    def _take_joined(self, name: str, t: float) -> bool:
        self._last_time[name] = t
        if name in self._joined:
            self._joined.discard(name)
            return True
        return False

    def _failed(self, ep: Endpoint, t0: float, reason: str) -> ScrapeResult:
        self.warn(ep.name, "scrape", f"scrape of {ep.name} ({ep.metrics_url}) failed: {reason}")
        now = time.monotonic()
        return ScrapeResult(
            ep.name,
            None,
            now,
            time.time(),
            latency=now - t0,
            error=reason,
            role=ep.role,
            groups=ep.groups,
            joined=self._take_joined(ep.name, now),
        )

    async def _fetch(self, ep: Endpoint) -> Response:
        if self._wire is None:
            await self._ensure_client()
            assert self._wire is not None
        return await fetch_metrics(
            self._wire, ep.metrics_url, headers=ep.headers, cap=self.max_body_bytes
        )

    # ------------------------------------------------------------------ side requests

    def _new_side(self, ep: Endpoint) -> _Side:
        return _Side(want_role=self.discover_roles and ep.role is None, want_models=True)

    def _side_task(self, ep: Endpoint, r: ScrapeResult) -> asyncio.Task[None] | None:
        """Start (or return the running) side requests of an endpoint that answered."""
        side = self._side.get(ep.name)
        if side is None or not r.ok:
            return None
        if side.want_role and r.exposition is not None:
            side.kv_consumer = side.kv_consumer or _kv_consumer(r.exposition)
        side.want_models = side.want_models and self.fetch_model_info
        if not (side.want_role or side.want_models):
            return None
        if side.task is not None and not side.task.done():
            return side.task
        if not side.backoff.due(time.monotonic()):
            return None
        side.task = asyncio.get_running_loop().create_task(self._side_requests(ep.name, side))
        return side.task

    async def _side_requests(self, name: str, side: _Side) -> None:
        client = await self._ensure_client()
        ep = next((e for e in self.endpoints if e.name == name), None)
        if ep is None:
            return
        failed = False
        if side.want_role:
            try:
                info = await get_json(
                    client,
                    ep.base_url + "/get_metrics_worker_info",
                    headers=ep.headers,
                    deadline=self.side_timeout,
                )
                role = info.get("role") if isinstance(info, dict) else None
                self._role_answer(name, side, role)
            except Exception as e:
                if _definite(e):  # no such route: the server has no role to tell
                    self._role_answer(name, side, None)
                else:
                    failed = True
        if side.want_models:
            try:
                data = await get_json(
                    client,
                    ep.base_url + "/v1/models",
                    headers=ep.headers,
                    deadline=self.side_timeout,
                )
                models = data.get("data", []) if isinstance(data, dict) else []
                lens = [m.get("max_model_len") for m in models if isinstance(m, dict)]
                ints = [int(x) for x in lens if isinstance(x, int | float)]
                self.max_model_len[name] = max(ints) if ints else None
                side.want_models = False
            except Exception as e:
                self.max_model_len.setdefault(name, None)
                self.warn(
                    name,
                    "models",
                    f"/v1/models of {name} unavailable: {describe(e, self.side_timeout)}"
                    + ("" if _definite(e) else f"; asking again in {side.backoff.wait:g} s"),
                )
                if _definite(e):
                    side.want_models = False
                else:
                    failed = True
        if failed:
            side.backoff.failed(time.monotonic())

    def _role_answer(self, name: str, side: _Side, role: object) -> None:
        """The server's answer; without one, vLLM's KV-consumer gauge marks a decode server."""
        side.want_role = False
        if role not in ("prefill", "decode") and side.kv_consumer:
            role = "decode"
        if role == "prefill" or role == "decode":
            self._set_role(name, role)

    def _set_role(self, name: str, role: Role) -> None:
        self.members.set_role(name, role)
        log.info("fleetscope: %s discovered as a %s server", name, role)


def _definite(e: BaseException) -> bool:
    """An answer that will not change if asked again (404, 405, 501: no such route)."""
    return isinstance(e, ScrapeError) and str(e) in ("HTTP 404", "HTTP 405", "HTTP 501")


def _kv_consumer(expo: Exposition) -> bool:
    return KV_CONSUMER_FAMILY in expo.types or any(
        g.name == KV_CONSUMER_FAMILY for s in expo.values() for g in s.layout.gauges
    )
