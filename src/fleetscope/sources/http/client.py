"""HTTP plumbing for the HTTP source: one warm connection per endpoint, capped reads, a total
deadline on every request, and failures described in one line.

``/metrics`` scrapes (the hot path) go through :mod:`fleetscope.sources.http.wire`, a minimal
HTTP/1.1 client (~10x less CPU per fetch than httpx: docs/sources.md); side requests (roles,
model info, versions) through httpx. Both share one TLS context, built off the event loop."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Mapping
from typing import Any

import httpcore  # noqa: F401  (httpx imports it at its first transport: ~1 s on the loop)
import httpx

from fleetscope.sources.http.wire import (
    BodyTooLarge,
    ConnectFailed,
    Disconnected,
    ProtocolFailure,
    Refused,
    Response,
    WireClient,
)

ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.9,*/*;q=0.1"
# content types a Prometheus exposition can come with; anything else is a wrong endpoint
TEXT_TYPES = ("text/plain", "application/openmetrics-text", "text/openmetrics")
# side requests (/v1/models, /get_metrics_worker_info) answer a few hundred bytes
SIDE_BODY_BYTES = 1024 * 1024


# the answering party says the server is not there (a proxy without its backend, a server
# not accepting work): as good as no answer for the continuity of its process
GATEWAY_STATUSES = frozenset({502, 503, 504})


class ScrapeError(Exception):
    """A response that is not an exposition (status, content type, size)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def new_clients(
    headers: Mapping[str, str], verify: bool | str, timeout: float
) -> tuple[httpx.AsyncClient, WireClient]:
    """The side-request client and the scrape client, sharing one TLS context (blocking: loads
    the CA bundle; call it off the event loop)."""
    ssl_context = _ssl_context(verify)
    return new_client(headers, verify, timeout, ssl_context), WireClient(headers, ssl_context)


def _ssl_context(verify: bool | str) -> ssl.SSLContext:
    """httpx's context (certifi, ``SSL_CERT_FILE``); a CA path as httpx took it (a file or a
    directory), without httpx 0.28's deprecation of ``verify=<str>``."""
    if isinstance(verify, str):
        if os.path.isdir(verify):
            return ssl.create_default_context(capath=verify)
        return ssl.create_default_context(cafile=verify)
    return httpx.create_ssl_context(verify=verify)


def new_client(
    headers: Mapping[str, str],
    verify: bool | str,
    timeout: float,
    ssl_context: ssl.SSLContext | None = None,
) -> httpx.AsyncClient:
    """A client whose transport keeps one pool (and one warm connection) per endpoint."""
    # concurrency is bounded by the source's semaphore; each endpoint keeps one warm connection
    # so a big fleet does not reconnect (TCP + HTTP setup) every poll
    limits = httpx.Limits(
        max_connections=None, max_keepalive_connections=None, keepalive_expiry=300
    )
    # the CA bundle is loaded once here and shared by every endpoint's pool
    if ssl_context is None:
        ssl_context = _ssl_context(verify)
    return httpx.AsyncClient(
        headers=dict(headers),
        transport=_PerOriginTransport(verify=ssl_context, limits=limits),
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
    )


async def read_capped(r: httpx.Response, cap: int, *, text_only: bool) -> bytes:
    """The body of ``r``, refused past ``cap`` bytes (declared or streamed)."""
    if r.status_code != 200:
        raise ScrapeError(f"HTTP {r.status_code}")
    if text_only:
        ctype = r.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and ctype not in TEXT_TYPES:
            raise ScrapeError(f"wrong content type {ctype!r}")
    declared = r.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise ScrapeError(f"body of {int(declared)} bytes exceeds the {cap} byte cap")
    chunks: list[bytes] = []
    size = 0
    async for chunk in r.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise ScrapeError(f"body exceeds the {cap} byte cap")
        chunks.append(chunk)
    return b"".join(chunks)


async def fetch_metrics(
    wire: WireClient, url: str, *, headers: Mapping[str, str], cap: int
) -> Response:
    """GET an exposition over the scrape client: 200, a text content type, <= ``cap`` bytes."""
    try:
        r = await wire.get(url, headers, cap=cap)
    except BodyTooLarge as e:
        raise ScrapeError(str(e)) from None
    if r.status != 200:
        raise ScrapeError(f"HTTP {r.status}", r.status)
    ctype = r.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype not in TEXT_TYPES:
        raise ScrapeError(f"wrong content type {ctype!r}")
    return r


async def get_capped(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    cap: int,
    text_only: bool = True,
) -> bytes:
    """GET ``url``; retried once on a fresh connection when a reused keep-alive connection was
    closed by the server before it answered (uvicorn closes idle ones after 5 s: routine)."""
    for attempt in range(2):
        answered = False
        try:
            async with client.stream("GET", url, headers=dict(headers)) as r:
                answered = True
                return await read_capped(r, cap, text_only=text_only)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            if answered or attempt:
                raise
    raise AssertionError("unreachable")


async def get_json(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    deadline: float,
    cap: int = SIDE_BODY_BYTES,
) -> Any:
    """A small JSON document, within ``deadline`` seconds in all and ``cap`` bytes."""
    body = await asyncio.wait_for(
        get_capped(client, url, headers=headers, cap=cap, text_only=False), timeout=deadline
    )
    return json.loads(body)


def went_away(e: BaseException) -> bool:
    """Whether a failed scrape shows the server was not there to answer (no connection, one
    that broke before the response was complete, a gateway's 502/503/504): its process may
    have changed since. A server that answered anything else, or late, was there."""
    if isinstance(e, ScrapeError):
        return e.status in GATEWAY_STATUSES
    return isinstance(
        e,
        ConnectFailed
        | Disconnected
        | httpx.ConnectError
        | httpx.RemoteProtocolError
        | httpx.ReadError
        | ConnectionError,
    )


def describe(e: BaseException, timeout: float) -> str:
    """One line saying why a request failed."""
    if isinstance(e, asyncio.TimeoutError | httpx.TimeoutException):
        return f"timed out after {timeout:g} s"
    if isinstance(e, Refused):
        return "connection refused"
    if isinstance(e, httpx.ConnectError | ConnectFailed):
        return f"connection failed ({e})" if str(e) else "connection refused"
    if isinstance(e, httpx.RemoteProtocolError | ProtocolFailure):
        return f"truncated or malformed response ({e})"
    if isinstance(e, ScrapeError):
        return str(e)
    return f"{type(e).__name__}: {e}"


class _PerOriginTransport(httpx.AsyncBaseTransport):
    """One connection pool per endpoint (scheme, host, port). httpcore's pool scans all of its
    connections for every queued request at every request event, so a single pool for N
    endpoints costs O(N²) per poll: ~20 s of CPU per poll for 256 endpoints, where one pool
    each costs nothing."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._pools: dict[tuple[bytes, bytes, int | None], httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key = (url.raw_scheme, url.raw_host, url.port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = httpx.AsyncHTTPTransport(**self._kwargs)
        return await pool.handle_async_request(request)

    def forget(self, base_url: str) -> None:
        """Drop an endpoint's pool (it left the fleet); closed in the background."""
        url = httpx.URL(base_url)
        pool = self._pools.pop((url.raw_scheme, url.raw_host, url.port), None)
        if pool is not None:
            task = asyncio.get_running_loop().create_task(pool.aclose())
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


_BACKGROUND: set[asyncio.Task[None]] = set()
