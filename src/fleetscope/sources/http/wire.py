"""A minimal HTTP/1.1 GET client on asyncio streams, for the ``/metrics`` hot path only.

Why: a scrape of one engine must cost the trainer ~0.1 ms of CPU besides the parse
(issue 12). ``benchmarks/bench_http.py`` fetches 256 simulated endpoints' 53 kB bodies over warm
keep-alive connections: httpx costs ~1.4 ms of CPU per fetch, aiohttp ~0.27 ms, this client
~0.13 ms, blocking sockets without an event loop ~0.07-0.1 ms (the table is in
docs/sources.md). Side requests (roles, model info, versions) stay on httpx: they are rare.

What it does: ``GET`` with the caller's headers (``Host``, ``Accept-Encoding: gzip``, basic
auth from userinfo in the URL); one idle keep-alive connection kept per origin (scheme, host,
port) and reused; a response body read by ``Content-Length``, ``chunked`` transfer coding or up
to the connection's close (HTTP/1.0), refused past ``cap`` bytes (declared, received or
decompressed); ``gzip`` content coding; TLS with the caller's ``ssl.SSLContext``; IPv6 literal
hosts. No redirects (a 3xx is a status like any other), no proxies, no HTTP/2, no cookies.

Any error, cancellation (the caller's deadline) or unread body closes the connection; only a
complete response that lets the connection live returns it to the pool. A reused connection
that the server had closed while idle (keep-alive timeout) is retried once on a fresh
connection, and only if nothing at all was received on it. A response says how long its
connection had idled since its previous response (``kept_idle``, a reused connection), or how
long the kept one had idled when the server closed it (``dropped_idle``): the HTTP source's
evidence that a server process lived on between two scrapes (sources/http/continuity.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = [
    "ConnectFailed",
    "Disconnected",
    "ProtocolFailure",
    "Refused",
    "Response",
    "WireClient",
    "WireError",
]

HEAD_LIMIT = 64 * 1024  # status line + headers
STREAM_LIMIT = 1024 * 1024  # StreamReader buffer: a typical body arrives without pausing
READ_SIZE = 256 * 1024
IDLE_PER_ORIGIN = 4
IDLE_EXPIRY = 300.0  # seconds, as httpx's keepalive_expiry was: a NAT may have dropped it
USER_AGENT = "fleetscope"


class WireError(Exception):
    """The request failed below HTTP semantics (connection, framing)."""


class ConnectFailed(WireError):
    """No connection could be made (DNS, TCP, TLS handshake or certificate)."""


class Refused(ConnectFailed):
    """Nothing listened at the address (the connection was refused)."""


class ProtocolFailure(WireError):
    """The server closed the connection early or answered something that is not HTTP/1.x."""


class Disconnected(ProtocolFailure):
    """The connection closed or broke before the response was complete."""


class BodyTooLarge(Exception):
    """The body is (or would be, decompressed) larger than the cap."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    kept_idle: float | None = None  # seconds the reused connection idled before this request
    dropped_idle: float | None = None  # seconds the kept one idled before the server closed it


@dataclass(frozen=True, slots=True)
class _Target:
    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    request: bytes


class _Protocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, noting when the peer closed the connection."""

    closed_at: float | None = None

    def eof_received(self) -> bool:
        self._note_close()
        return bool(super().eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        self._note_close()
        super().connection_lost(exc)

    def _note_close(self) -> None:
        if self.closed_at is None:
            self.closed_at = asyncio.get_running_loop().time()


class _Conn:
    __slots__ = ("idle_since", "loop", "protocol", "reader", "writer")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, protocol: _Protocol
    ) -> None:
        self.reader, self.writer, self.protocol = reader, writer, protocol
        self.loop = asyncio.get_running_loop()
        self.idle_since = 0.0

    def usable(self) -> bool:
        loop = asyncio.get_running_loop()
        return (
            self.loop is loop
            and loop.time() - self.idle_since < IDLE_EXPIRY
            and not self.closed_by_peer()
        )

    def closed_by_peer(self) -> bool:
        return self.writer.transport.is_closing() or self.reader.at_eof()

    def idled_until_closed(self) -> float:
        """Seconds this idle connection lived before the peer closed it (to now if unknown)."""
        closed = self.protocol.closed_at
        return (self.loop.time() if closed is None else closed) - self.idle_since

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


class WireClient:
    """GETs over per-origin keep-alive connections. ``headers`` are sent with every request
    (a request's own headers override them, case-insensitively)."""

    def __init__(self, headers: Mapping[str, str], ssl_context: ssl.SSLContext | None) -> None:
        self._headers = dict(headers)
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._targets: dict[tuple[str, tuple[tuple[str, str], ...]], _Target] = {}

    async def get(
        self, url: str, headers: Mapping[str, str] | None = None, *, cap: int
    ) -> Response:
        """The response to ``GET url``; the body of any status is read (up to ``cap``)."""
        t = self._target(url, headers)
        dropped: float | None = None
        for attempt in (0, 1):
            conn, closed_idle = self._take_idle(t.key)
            dropped = closed_idle if dropped is None else dropped
            reused = conn is not None
            kept = conn.loop.time() - conn.idle_since if conn is not None else None
            if conn is None:
                conn = await self._connect(t)
            try:
                conn.writer.write(t.request)
                try:
                    head = await conn.reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError) as e:
                    nothing = not isinstance(e, asyncio.IncompleteReadError) or not e.partial
                    if reused and nothing and attempt == 0:
                        dropped = conn.idled_until_closed()
                        conn.close()  # closed while idle: once more, on a fresh connection
                        continue
                    raise
                status, headers_in, keep = _parse_head(head)
                while 100 <= status < 200 and status != 101:  # interim responses
                    status, headers_in, keep = _parse_head(await conn.reader.readuntil(b"\r\n\r\n"))
                if status in (204, 304):  # never a body
                    body = b""
                else:
                    body, keep = await _read_body(conn.reader, headers_in, keep, cap)
            except BaseException as e:
                conn.close()
                if isinstance(e, asyncio.IncompleteReadError):
                    what = "inside the response head" if e.partial else "without a response"
                    raise Disconnected(f"server closed the connection {what}") from None
                if isinstance(e, asyncio.LimitOverrunError):
                    raise ProtocolFailure("response head too large") from None
                if isinstance(e, ConnectionError):
                    raise Disconnected(f"connection lost: {e}") from e
                raise
            if keep:
                conn.idle_since = conn.loop.time()
                self._idle.setdefault(t.key, []).append(conn)
                if len(self._idle[t.key]) > IDLE_PER_ORIGIN:
                    self._idle[t.key].pop(0).close()
            else:
                conn.close()
            return Response(status, headers_in, body, kept, None if reused else dropped)
        raise AssertionError("unreachable")

    def _take_idle(self, key: tuple[str, str, int]) -> tuple[_Conn | None, float | None]:
        """A usable kept connection to ``key`` (or None), and how long the first one found
        closed by the server had idled when it closed (None if none was)."""
        idle = self._idle.get(key)
        closed_idle = None
        while idle:
            c = idle.pop()
            if c.usable():
                return c, closed_idle
            if closed_idle is None and c.loop is asyncio.get_running_loop() and c.closed_by_peer():
                closed_idle = c.idled_until_closed()
            c.close()
        return None, closed_idle

    async def _connect(self, t: _Target) -> _Conn:
        if t.tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
        protocol = _Protocol(reader, loop=loop)
        try:  # asyncio.open_connection, with a protocol that notes the peer's close
            transport, _ = await loop.create_connection(
                lambda: protocol,
                t.host,
                t.port,
                ssl=self._ssl if t.tls else None,
                server_hostname=t.host if t.tls else None,
            )
        except ConnectionRefusedError as e:
            raise Refused(str(e) or "connection refused") from e
        except (OSError, ssl.SSLError) as e:  # DNS, unreachable, TLS (certificate, handshake)
            raise ConnectFailed(str(e) or type(e).__name__) from e
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        return _Conn(reader, writer, protocol)

    def _target(self, url: str, headers: Mapping[str, str] | None) -> _Target:
        hkey = tuple(headers.items()) if headers else ()
        t = self._targets.get((url, hkey))
        if t is None:
            if len(self._targets) > 4096:
                self._targets.clear()
            t = self._targets[(url, hkey)] = self._build(url, headers or {})
        return t

    def _build(self, url: str, headers: Mapping[str, str]) -> _Target:
        u = urlsplit(url)
        scheme = u.scheme.lower()
        if scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        host = u.hostname
        port = u.port or (443 if scheme == "https" else 80)
        shown = f"[{host}]" if ":" in host else host
        if u.port is not None:
            shown += f":{port}"
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        fields = {"host": ("Host", shown), "user-agent": ("User-Agent", USER_AGENT)}
        fields["accept-encoding"] = ("Accept-Encoding", "gzip")
        for source in (self._headers, headers):
            for name, value in source.items():
                fields[name.lower()] = (name, value)
        if u.username is not None or u.password is not None:  # as httpx: userinfo wins
            cred = f"{unquote(u.username or '')}:{unquote(u.password or '')}"
            auth = "Basic " + base64.b64encode(cred.encode()).decode("ascii")
            fields["authorization"] = ("Authorization", auth)
        lines = [f"GET {path} HTTP/1.1"]
        for name, value in fields.values():
            if any(c in name for c in ":\r\n ") or "\r" in value or "\n" in value:
                raise ValueError(f"invalid header {name!r}")
            lines.append(f"{name}: {value}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return _Target((scheme, host, port), host, port, scheme == "https", request)

    def forget(self, url: str) -> None:
        """Close the idle connections to ``url``'s origin (it left the fleet)."""
        u = urlsplit(url)
        scheme = u.scheme.lower()
        key = (scheme, u.hostname or "", u.port or (443 if scheme == "https" else 80))
        for c in self._idle.pop(key, []):
            c.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                c.close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """(status, headers, whether the connection may stay open) of a response head."""
    if len(head) > HEAD_LIMIT:
        raise ProtocolFailure("response head too large")
    lines = head[:-4].decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if (
        version not in ("HTTP/1.1", "HTTP/1.0")
        or len(code) != 3
        or not code.isdigit()
        or rest[3:4] not in ("", " ")
    ):
        raise ProtocolFailure(f"malformed status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or not name.isascii():
            raise ProtocolFailure(f"malformed header line {line[:80]!r}")
        name = name.lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if version == "HTTP/1.1":
        keep = "close" not in tokens
    else:
        keep = "keep-alive" in tokens
    return int(code), headers, keep


async def _read_body(
    reader: asyncio.StreamReader, headers: dict[str, str], keep: bool, cap: int
) -> tuple[bytes, bool]:
    """The decoded body and whether the connection may be reused."""
    coding = headers.get("transfer-encoding", "").lower()
    if coding:
        if coding != "chunked":
            raise ProtocolFailure(f"unsupported transfer encoding {coding!r}")
        body = await _read_chunked(reader, cap)
    elif "content-length" in headers:
        lengths = {v.strip() for v in headers["content-length"].split(",")}
        declared = lengths.pop()
        if lengths or not declared.isdigit():
            raise ProtocolFailure(f"bad Content-Length {headers['content-length'][:40]!r}")
        n = int(declared)
        if n > cap:
            raise BodyTooLarge(f"body of {n} bytes exceeds the {cap} byte cap")
        try:
            body = await reader.readexactly(n) if n else b""
        except asyncio.IncompleteReadError as e:
            raise Disconnected(f"body truncated: {len(e.partial)} of {n} bytes received") from None
    else:  # delimited by the connection's close
        parts: list[bytes] = []
        size = 0
        while chunk := await reader.read(READ_SIZE):
            size += len(chunk)
            if size > cap:
                raise BodyTooLarge(f"body exceeds the {cap} byte cap")
            parts.append(chunk)
        body, keep = b"".join(parts), False
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding == "gzip":
        body = _gunzip(body, cap)
    elif encoding != "identity":
        raise ProtocolFailure(f"unsupported content encoding {encoding!r}")
    return body, keep


async def _read_chunked(reader: asyncio.StreamReader, cap: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    try:
        while True:
            line = await reader.readuntil(b"\r\n")
            digits = line.split(b";", 1)[0].strip()
            try:
                n = int(digits, 16)
            except ValueError:
                raise ProtocolFailure(f"bad chunk size {line[:40]!r}") from None
            if n < 0:
                raise ProtocolFailure(f"bad chunk size {line[:40]!r}")
            if n == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            size += n
            if size > cap:
                raise BodyTooLarge(f"body exceeds the {cap} byte cap")
            chunk = await reader.readexactly(n + 2)
            if chunk[-2:] != b"\r\n":
                raise ProtocolFailure("chunk not terminated by CRLF")
            parts.append(chunk[:-2])
    except asyncio.IncompleteReadError:
        raise Disconnected(f"chunked body truncated after {size} bytes") from None
    except asyncio.LimitOverrunError:
        raise ProtocolFailure("chunk size line too long") from None


def _gunzip(data: bytes, cap: int) -> bytes:
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, cap + 1)
    except zlib.error as e:
        raise ProtocolFailure(f"bad gzip body: {e}") from None
    if len(out) > cap:
        raise BodyTooLarge(f"decompressed body exceeds the {cap} byte cap")
    if not d.eof:
        raise ProtocolFailure("gzip body truncated")
    return out
