"""Scraping vLLM ``/metrics`` endpoints over HTTP: concurrent, bounded, capped, timed.

Bodies are parsed off the event loop (a worker thread), so a training loop sharing the loop is
never stalled by a big fleet. Every failure becomes a failed :class:`ScrapeResult` plus a
rate-limited warning naming the endpoint; nothing is raised to the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from fleetscope._warn import RateLimitedWarner
from fleetscope.exposition import MAX_BODY_BYTES, ExpositionError, Parser
from fleetscope.fleet import ScrapeResult
from fleetscope.stats.reduce import Role

log = logging.getLogger("fleetscope")

ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.9,*/*;q=0.1"
# content types a Prometheus exposition can come with; anything else is a wrong endpoint
TEXT_TYPES = ("text/plain", "application/openmetrics-text", "text/openmetrics")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One base URL serving ``/metrics`` (a vLLM API server), with its name and role."""

    url: str
    name: str = ""
    role: Role | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    groups: tuple[str, ...] = ()

    @property
    def metrics_url(self) -> str:
        u = self.url.rstrip("/")
        return u if u.endswith("/metrics") else u + "/metrics"

    @property
    def base_url(self) -> str:
        u = self.url.rstrip("/")
        return u[: -len("/metrics")] if u.endswith("/metrics") else u


def name_endpoints(
    endpoints: Sequence[str | Endpoint], taken: Iterable[str] = ()
) -> list[Endpoint]:
    """Give unnamed endpoints their display names, counted per role in the order given:
    ``server0, server1`` / ``prefill0`` / ``decode0, decode1``, skipping names in ``taken``."""
    counters: dict[str, int] = {}
    out: list[Endpoint] = []
    taken = set(taken)
    given = [e.name for e in endpoints if isinstance(e, Endpoint) and e.name]
    clash = taken.intersection(given)
    if clash:
        raise ValueError(f"endpoint names already in use: {sorted(clash)}")
    taken.update(given)
    for e in endpoints:
        ep = e if isinstance(e, Endpoint) else Endpoint(url=e)
        if not ep.name:
            prefix = ep.role or "server"
            while True:
                i = counters.get(prefix, 0)
                counters[prefix] = i + 1
                if f"{prefix}{i}" not in taken:
                    break
            ep = Endpoint(ep.url, f"{prefix}{i}", ep.role, ep.headers, ep.groups)
        taken.add(ep.name)
        out.append(ep)
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise ValueError(f"endpoint names must be unique: {names}")
    return out


class HttpSource:
    """Scrapes endpoints with one shared ``httpx.AsyncClient``."""

    def __init__(
        self,
        *,
        timeout: float = 5.0,
        max_concurrency: int = 64,
        max_body_bytes: int = MAX_BODY_BYTES,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
        parse_workers: int = 1,
        warn_interval: float = 60.0,
        identity_labels: Sequence[str] | None = None,
    ):
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self._headers = {"Accept": ACCEPT, **(headers or {})}
        self._verify = verify
        self._sem = asyncio.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._client: httpx.AsyncClient | None = None
        self._client_lock = asyncio.Lock()
        self._parsers: dict[str, Parser] = {}
        self._pool = ThreadPoolExecutor(parse_workers, thread_name_prefix="fleetscope-parse")
        self._warner = RateLimitedWarner(log, interval=warn_interval, prefix="fleetscope: ")
        self._identity = identity_labels
        self.max_model_len: dict[str, int | None] = {}

    def _new_client(self) -> httpx.AsyncClient:
        # concurrency is bounded by our semaphore; each endpoint keeps one warm connection so
        # a big fleet does not reconnect (TCP + HTTP setup) every poll
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=None, keepalive_expiry=300
        )
        # the CA bundle is loaded once here and shared by every endpoint's pool
        ssl_context = httpx.create_ssl_context(verify=self._verify)
        return httpx.AsyncClient(
            headers=self._headers,
            transport=_PerOriginTransport(verify=ssl_context, limits=limits),
            timeout=httpx.Timeout(self.timeout),
            follow_redirects=False,
        )

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = self._new_client()
        return self._client

    async def _ensure_client(self) -> httpx.AsyncClient:
        """The shared client, built off the event loop: with TLS verification on, httpx loads
        the CA bundle synchronously (0.3-0.9 s), which must not stall the caller's loop."""
        async with self._client_lock:
            if self._client is None:
                loop = asyncio.get_running_loop()
                self._client = await loop.run_in_executor(None, self._new_client)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    def warn(self, endpoint: str, kind: str, message: str) -> None:
        self._warner.warn(f"{endpoint}:{kind}", message)

    def forget(self, name: str) -> None:
        """An endpoint left the fleet: drop its parser and cached model info."""
        self._parsers.pop(name, None)
        self.max_model_len.pop(name, None)

    async def scrape_all(self, endpoints: Sequence[Endpoint]) -> list[ScrapeResult]:
        return list(await asyncio.gather(*(self.scrape(e) for e in endpoints)))

    async def scrape(self, ep: Endpoint) -> ScrapeResult:
        await self._ensure_client()  # once, before (not inside) the endpoint's timeout
        async with self._sem:
            t0 = time.monotonic()
            try:
                body = await asyncio.wait_for(self._fetch(ep), timeout=self.timeout * 1.5)
            except Exception as e:
                return self._failed(ep, t0, _describe(e, self.timeout))
            t_arrived, wall = time.monotonic(), time.time()
        parser = self._parsers.get(ep.name)
        if parser is None:
            parser = self._parsers[ep.name] = Parser(
                identity_labels=self._identity, max_bytes=self.max_body_bytes
            )
        loop = asyncio.get_running_loop()
        try:
            expo = await loop.run_in_executor(
                self._pool, lambda: parser.parse(body, time=t_arrived, wall_time=wall)
            )
        except ExpositionError as e:
            return self._failed(ep, t0, f"bad exposition: {e}")
        except Exception as e:
            return self._failed(ep, t0, f"parser failed: {type(e).__name__}: {e}")
        return ScrapeResult(
            ep.name,
            expo,
            t_arrived,
            wall,
            latency=t_arrived - t0,
            role=ep.role,
            groups=ep.groups,
        )

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
        )

    async def _fetch(self, ep: Endpoint) -> bytes:
        client = await self._ensure_client()
        for attempt in range(2):
            answered = False
            try:
                async with client.stream("GET", ep.metrics_url, headers=dict(ep.headers)) as r:
                    answered = True
                    return await self._read(r)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                # No answer at all: the server closed the keep-alive connection as we reused
                # it. uvicorn (vLLM's server) closes idle connections after 5 s, the default
                # poll interval, so this race is routine; the GET goes once more, on a fresh
                # connection. A response cut short after its head is a real failure.
                if answered or attempt:
                    raise
        raise AssertionError("unreachable")

    async def _read(self, r: httpx.Response) -> bytes:
        if r.status_code != 200:
            raise _ScrapeError(f"HTTP {r.status_code}")
        ctype = r.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and ctype not in TEXT_TYPES:
            raise _ScrapeError(f"wrong content type {ctype!r}")
        declared = r.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _ScrapeError(
                f"body of {int(declared)} bytes exceeds the {self.max_body_bytes} cap"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in r.aiter_bytes():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _ScrapeError(f"body exceeds the {self.max_body_bytes} byte cap")
            chunks.append(chunk)
        return b"".join(chunks)

    async def fetch_max_model_len(self, ep: Endpoint) -> int | None:
        """``max_model_len`` from ``/v1/models`` (the largest served); cached once known."""
        if self.max_model_len.get(ep.name) is not None:
            return self.max_model_len[ep.name]
        try:
            client = await self._ensure_client()
            r = await client.get(ep.base_url + "/v1/models", headers=dict(ep.headers))
            r.raise_for_status()
            lens = [m.get("max_model_len") for m in r.json().get("data", [])]
            lens = [int(x) for x in lens if isinstance(x, int | float)]
            value = max(lens) if lens else None
        except Exception as e:
            self.warn(ep.name, "models", f"/v1/models of {ep.name} unavailable: {_describe(e, 0)}")
            value = None
        self.max_model_len[ep.name] = value
        return value

    async def fetch_worker_info(self, ep: Endpoint) -> dict | None:
        """``GET /get_metrics_worker_info`` -> ``{"worker_id", "role"}`` (SkyRL's protocol)."""
        try:
            client = await self._ensure_client()
            r = await client.get(ep.base_url + "/get_metrics_worker_info", headers=dict(ep.headers))
            r.raise_for_status()
            data = r.json()
            return data if isinstance(data, dict) else None
        except Exception:
            return None


class _PerOriginTransport(httpx.AsyncBaseTransport):
    """One connection pool per endpoint (scheme, host, port). httpcore's pool scans all of its
    connections for every queued request at every request event, so a single pool for N
    endpoints costs O(N²) per poll: ~20 s of CPU per poll for 256 endpoints, where one pool
    each costs nothing."""

    def __init__(self, **kwargs) -> None:
        self._kwargs = kwargs
        self._pools: dict[tuple[bytes, bytes, int | None], httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key = (url.raw_scheme, url.raw_host, url.port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = httpx.AsyncHTTPTransport(**self._kwargs)
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


class _ScrapeError(Exception):
    pass


def _describe(e: BaseException, timeout: float) -> str:
    if isinstance(e, asyncio.TimeoutError | httpx.TimeoutException):
        return f"timed out after {timeout:g} s"
    if isinstance(e, httpx.ConnectError):
        return f"connection failed ({e})" if str(e) else "connection refused"
    if isinstance(e, httpx.RemoteProtocolError):
        return f"truncated or malformed response ({e})"
    if isinstance(e, _ScrapeError):
        return str(e)
    return f"{type(e).__name__}: {e}"
