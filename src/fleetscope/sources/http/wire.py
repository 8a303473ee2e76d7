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
connection, and only if nothing at all was received on it.
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

__all__ = ["ConnectFailed", "ProtocolFailure", "Refused", "Response", "WireClient", "WireError"]

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


class BodyTooLarge(Exception):
    """The body is (or would be, decompressed) larger than the cap."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes


@dataclass(frozen=True, slots=True)
class _Target:
    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    request: bytes


class _Conn:
    __slots__ = ("idle_since", "loop", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self.idle_since = 0.0

    def usable(self) -> bool:
        loop = asyncio.get_running_loop()
        return (
            self.loop is loop
            and loop.time() - self.idle_since < IDLE_EXPIRY
            and not self.writer.transport.is_closing()
            and not self.reader.at_eof()
        )

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
        for attempt in (0, 1):
            idle = self._idle.get(t.key)
            conn = None
            while idle and conn is None:
                c = idle.pop()
                if c.usable():
                    conn = c
                else:
                    c.close()
            reused = conn is not None
            if conn is None:
                conn = await self._connect(t)
            try:
                conn.writer.write(t.request)
                try:
                    head = await conn.reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError) as e:
                    nothing = not isinstance(e, asyncio.IncompleteReadError) or not e.partial
                    if reused and nothing and attempt == 0:
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
                    raise ProtocolFailure(f"server closed the connection {what}") from None
                if isinstance(e, asyncio.LimitOverrunError):
                    raise ProtocolFailure("response head too large") from None
                if isinstance(e, ConnectionError):
                    raise ProtocolFailure(f"connection lost: {e}") from e
                raise
            if keep:
                conn.idle_since = conn.loop.time()
                self._idle.setdefault(t.key, []).append(conn)
                if len(self._idle[t.key]) > IDLE_PER_ORIGIN:
                    self._idle[t.key].pop(0).close()
            else:
                conn.close()
            return Response(status, headers_in, body)
        raise AssertionError("unreachable")

    async def _connect(self, t: _Target) -> _Conn:
        if t.tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            reader, writer = await asyncio.open_connection(
                t.host,
                t.port,
                ssl=self._ssl if t.tls else None,
                server_hostname=t.host if t.tls else None,
                limit=STREAM_LIMIT,
            )
        except ConnectionRefusedError as e:
            raise Refused(str(e) or "connection refused") from e
        except (OSError, ssl.SSLError) as e:  # DNS, unreachable, TLS (certificate, handshake)
            raise ConnectFailed(str(e) or type(e).__name__) from e
        return _Conn(reader, writer)

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
            raise ProtocolFailure(
                f"body truncated: {len(e.partial)} of {n} bytes received"
            ) from None
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
        raise ProtocolFailure(f"chunked body truncated after {size} bytes") from None
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
