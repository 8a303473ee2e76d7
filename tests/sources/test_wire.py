"""The minimal HTTP/1.1 scrape client (``sources/_wire.py``) against scripted loopback servers.

Each test serves exactly the bytes it wants (``Script``: an ``asyncio`` server in the test's
own loop, one handler call per connection, connections counted), so framing, reuse and the
keep-alive retry are checked deterministically. Waits are on events, never on timing; the one
deadline test uses a server that never finishes its body.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import gc
import gzip
import ipaddress
import logging
import socket
import ssl
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from fleetscope.sources.http.client import (
    ScrapeError,
    describe,
    fetch_metrics,
    new_clients,
)
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.sources.http.wire import (
    BodyTooLarge,
    ConnectFailed,
    ProtocolFailure,
    Refused,
    WireClient,
)
from support.loopback import LoopbackServer

BODY = b'# TYPE vllm:x counter\nvllm:x_total{engine="0"} 1.0\n'
TEXT = b"Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
Handler = Callable[[Reader, Writer, int], Awaitable[None]]


def ok(body: bytes = BODY, extra: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return (
        (version + b" 200 OK\r\n" + TEXT + f"Content-Length: {len(body)}\r\n".encode() + extra)
        + b"\r\n"
        + body
    )


class Script:
    """A loopback server running ``handler(reader, writer, connection_index)`` per connection;
    ``requests`` holds every request head it read (through :meth:`request`)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1") -> None:
        self.handler, self.host = handler, host
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # set when a connection's peer (the client) closed it
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Script:
        self.server = await asyncio.start_server(self._serve, self.host, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}/metrics"

    async def request(self, reader: Reader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        return head

    async def _serve(self, reader: Reader, writer: Writer) -> None:
        i = self.connections
        self.connections += 1
        try:
            await self.handler(reader, writer, i)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def keep_alive(script_response: Callable[[int], bytes]) -> Handler:
    """Answer every request of a connection with ``script_response(request_number)``."""

    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        n = 0
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            writer.write(script_response(n))
            await writer.drain()
            n += 1

    return handler


@contextlib.asynccontextmanager
async def client(headers: dict[str, str] | None = None) -> AsyncIterator[WireClient]:
    c = WireClient(headers or {}, None)
    try:
        yield c
    finally:
        await c.aclose()


# ------------------------------------------------------------------------------ framing


async def test_content_length_body_and_one_connection_reused() -> None:
    async with Script(keep_alive(lambda n: ok())) as s, client() as c:
        for _ in range(3):
            assert (await fetch_metrics(c, s.url, headers={}, cap=1000)).body == BODY
        assert s.connections == 1


async def test_chunked_body_with_extensions_and_trailers() -> None:
    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\n" + TEXT + b"Transfer-Encoding: chunked\r\n\r\n")
            writer.write(b"5;name=value\r\nhello\r\n")
            writer.write(b"7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n")

    async with Script(handler) as s, client() as c:
        for _ in range(2):
            r = await c.get(s.url, cap=1000)
            assert r.status == 200 and r.body == b"hello, world"
        assert s.connections == 1


async def test_chunked_body_over_the_cap_and_truncated() -> None:
    async def endless(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:  # an infinite body, as fast as the client reads it
            writer.write(b"400\r\n" + b"x" * 1024 + b"\r\n")
            await writer.drain()

    async with Script(endless) as s, client() as c:
        with pytest.raises(BodyTooLarge, match="cap"):
            await c.get(s.url, cap=100_000)

    async def cut(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")

    async with Script(cut) as s, client() as c:
        with pytest.raises(ProtocolFailure, match="truncated"):
            await c.get(s.url, cap=1000)


async def test_http_1_0_server_body_until_close_and_no_reuse() -> None:
    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\n" + TEXT + b"\r\n" + BODY)  # no length: until close

    async with Script(handler) as s, client() as c:
        for _ in range(2):
            assert (await fetch_metrics(c, s.url, headers={}, cap=1000)).body == BODY
        assert s.connections == 2


async def test_http_1_0_keep_alive_is_reused_http_1_1_close_is_not() -> None:
    async with (
        Script(
            keep_alive(lambda n: ok(extra=b"Connection: keep-alive\r\n", version=b"HTTP/1.0"))
        ) as s,
        client() as c,
    ):
        for _ in range(2):
            assert (await c.get(s.url, cap=1000)).body == BODY
        assert s.connections == 1
    async with Script(keep_alive(lambda n: ok(extra=b"Connection: close\r\n"))) as s, client() as c:
        for _ in range(2):
            assert (await c.get(s.url, cap=1000)).body == BODY
        assert s.connections == 2


async def test_close_delimited_infinite_body_hits_the_cap() -> None:
    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        while True:
            writer.write(b"x" * 65536)
            await writer.drain()

    async with Script(handler) as s, client() as c:
        with pytest.raises(BodyTooLarge):
            await c.get(s.url, cap=1_000_000)


async def test_declared_length_over_the_cap_is_refused_before_reading() -> None:
    async with Script(keep_alive(lambda n: ok(b"x" * 5000))) as s, client() as c:
        with pytest.raises(ScrapeError, match="body of 5000 bytes exceeds the 4999 byte cap"):
            await fetch_metrics(c, s.url, headers={}, cap=4999)
        assert (await fetch_metrics(c, s.url, headers={}, cap=5000)).body == b"x" * 5000
        assert s.connections == 2  # the refused response's connection was dropped


async def test_truncated_body_fails_and_the_connection_is_dropped() -> None:
    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if conn == 0:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 40)
            return  # closes: the body is cut
        writer.write(ok())

    async with Script(handler) as s, client() as c:
        with pytest.raises(ProtocolFailure, match="truncated: 40 of 100") as e:
            await c.get(s.url, cap=1000)
        assert "truncated" in describe(e.value, 1.0)
        assert (await c.get(s.url, cap=1000)).body == BODY
        assert s.connections == 2


async def test_trickling_body_hits_the_deadline_and_the_connection_is_closed() -> None:
    dropped = asyncio.Event()

    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nxx")
        await writer.drain()
        while await reader.read(100):  # trickle nothing more; wait for the client to leave
            pass
        dropped.set()

    async with Script(handler) as s, client() as c:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await c.get(s.url, cap=10_000)
        assert not any(c._idle.values())
        await asyncio.wait_for(dropped.wait(), timeout=30)  # the client closed it
        assert "timed out" in describe(TimeoutError(), 0.2)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"<html>\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length : 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 3\r\n\r\nabc",
    ],
)
async def test_malformed_status_line_or_headers_fail_cleanly(head: bytes) -> None:
    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head)

    async with Script(handler) as s, client() as c:
        with pytest.raises(ProtocolFailure) as e:
            await c.get(s.url, cap=1000)
        assert describe(e.value, 1.0).startswith("truncated or malformed response")


async def test_interim_responses_are_skipped_and_204_has_no_body() -> None:
    responses = [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" + ok()]
    responses.append(b"HTTP/1.1 204 No Content\r\n\r\n")
    async with Script(keep_alive(lambda n: responses[n])) as s, client() as c:
        assert (await c.get(s.url, cap=1000)).body == BODY
        r = await c.get(s.url, cap=1000)
        assert (r.status, r.body) == (204, b"")
        assert s.connections == 1


async def test_redirects_are_not_followed() -> None:
    redirect = b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"
    async with Script(keep_alive(lambda n: redirect)) as s, client() as c:
        with pytest.raises(ScrapeError, match="HTTP 302"):
            await fetch_metrics(c, s.url, headers={}, cap=1000)
        assert len(s.requests) == 0 and s.connections == 1


async def test_gzip_is_asked_for_decoded_and_capped_decompressed() -> None:
    packed = gzip.compress(BODY * 100)
    head = b"HTTP/1.1 200 OK\r\n" + TEXT + b"Content-Encoding: gzip\r\n"
    response = head + f"Content-Length: {len(packed)}\r\n\r\n".encode() + packed
    seen: list[bytes] = []

    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        while True:
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(response)

    async with Script(handler) as s, client() as c:
        assert (await fetch_metrics(c, s.url, headers={}, cap=len(BODY) * 100)).body == BODY * 100
        assert b"\r\nAccept-Encoding: gzip\r\n" in seen[0]
        with pytest.raises(ScrapeError, match="decompressed body exceeds"):  # a gzip bomb
            await fetch_metrics(c, s.url, headers={}, cap=len(BODY) * 100 - 1)


# ------------------------------------------------------------------------ keep-alive timeouts


async def test_server_closing_an_idle_connection_is_retried_on_a_fresh_one() -> None:
    """uvicorn closes idle connections after 5 s: the close races with the next request. A
    reused connection that answers nothing at all is retried once, on a new connection."""

    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ok())
        await writer.drain()
        if conn == 0:
            await reader.readuntil(b"\r\n\r\n")  # the second request arrives: close, no answer
            return
        with contextlib.suppress(asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")

    async with Script(handler) as s, client() as c:
        assert (await c.get(s.url, cap=1000)).body == BODY
        second = await c.get(s.url, cap=1000)
        assert second.body == BODY
        assert s.connections == 2
        # and the fresh connection's response says the kept one was dropped (continuity.py)
        assert second.kept_idle is None and second.dropped_idle is not None


async def test_an_idle_connection_already_closed_is_not_written_to() -> None:
    handler = keep_alive(lambda n: ok(extra=b"Connection: keep-alive\r\n"))
    async with Script(handler) as s, client() as c:
        assert (await c.get(s.url, cap=1000)).body == BODY
        ((conn,),) = c._idle.values()
        conn.reader.feed_eof()  # as when the server's FIN has arrived
        assert (await c.get(s.url, cap=1000)).body == BODY
        assert s.connections == 2


async def test_an_idle_connection_past_its_expiry_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fleetscope.sources.http.wire as wire

    async with Script(keep_alive(lambda n: ok())) as s, client() as c:
        await c.get(s.url, cap=1000)
        monkeypatch.setattr(wire, "IDLE_EXPIRY", -1.0)
        await c.get(s.url, cap=1000)
        assert s.connections == 2


async def test_a_response_says_how_long_its_connection_idled_or_when_the_server_closed_it() -> None:
    """The continuity evidence (sources/http/continuity.py): a reused connection's idle time,
    and for one the server closed, how long it had idled when the server closed it (measured
    at the close, not at the next request)."""
    closed = asyncio.Event()
    close_now = asyncio.Event()

    async def handler(reader: Reader, writer: Writer, conn: int) -> None:
        n = 0
        while True:
            if conn == 0 and n == 2:  # close the kept connection when told, idle
                await close_now.wait()
                writer.close()
                closed.set()
                return
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            writer.write(ok())
            await writer.drain()
            n += 1

    async with Script(handler) as s, client() as c:
        first = await c.get(s.url, cap=1000)
        assert first.kept_idle is None and first.dropped_idle is None  # a fresh connection
        await asyncio.sleep(0.05)
        second = await c.get(s.url, cap=1000)
        assert second.kept_idle is not None and second.kept_idle >= 0.05
        assert second.dropped_idle is None
        close_now.set()
        await closed.wait()
        ((conn,),) = c._idle.values()
        while not conn.closed_by_peer():  # the FIN reaches the client's loop
            await asyncio.sleep(0.01)
        closed_after = conn.idled_until_closed()
        await asyncio.sleep(0.2)  # the next request comes later: the close time still counts
        third = await c.get(s.url, cap=1000)
        assert third.kept_idle is None and third.dropped_idle == closed_after
        assert third.dropped_idle < 0.2
        assert s.connections == 2


async def test_no_retry_when_something_was_received_or_the_connection_was_fresh() -> None:
    async def partial(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ok())
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200")  # part of a head, then the close

    async with Script(partial) as s, client() as c:
        await c.get(s.url, cap=1000)
        with pytest.raises(ProtocolFailure, match="inside the response head"):
            await c.get(s.url, cap=1000)
        assert s.connections == 1

    async def mute(reader: Reader, writer: Writer, conn: int) -> None:
        await reader.readuntil(b"\r\n\r\n")  # and close without a word

    async with Script(mute) as s, client() as c:
        with pytest.raises(ProtocolFailure, match="without a response"):
            await c.get(s.url, cap=1000)
        assert s.connections == 1


async def test_refused_connection_and_forget() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with client() as c:
        with pytest.raises(Refused) as e:
            await c.get(f"http://127.0.0.1:{port}/metrics", cap=1000)
        assert describe(e.value, 1.0) == "connection refused"
    async with Script(keep_alive(lambda n: ok())) as s, client() as c:
        await c.get(s.url, cap=1000)
        c.forget(s.url.removesuffix("/metrics"))
        assert not c._idle
        await c.get(s.url, cap=1000)
        assert s.connections == 2


def test_a_connection_is_never_reused_from_another_event_loop() -> None:
    """A collector's source may be driven by one loop, then another (``asyncio.run`` twice)."""
    # asyncio cannot close a transport whose loop has ended: the connections of the ended loops
    # are freed by the garbage collector, with a ResourceWarning each (here, not in whichever
    # test runs the next collection)
    with (
        LoopbackServer({"/metrics": BODY}, protocol="HTTP/1.1") as server,  # keep-alive
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", ResourceWarning)
        c = WireClient({}, None)
        for _ in range(2):
            assert asyncio.run(c.get(server.metrics_url, cap=1000)).body == BODY
        assert server.connections == 2
        del c
        gc.collect()


# ------------------------------------------------------------------------ request headers


async def test_headers_host_userinfo_and_overrides() -> None:
    seen: list[bytes] = []

    async def record(reader: Reader, writer: Writer, conn: int) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(ok())

    async with Script(record) as s, client({"Accept": "text/plain", "X-Team": "a"}) as c:
        port = s.url.split(":")[2].split("/")[0]
        url = s.url.replace("http://", "http://us%40er:p%3Ass@") + "?x=1"
        await c.get(url, {"x-team": "b", "X-Extra": "1"}, cap=1000)
        with pytest.raises(ValueError, match="invalid header"):
            await c.get(s.url, {"X-Bad": "a\r\nInjected: 1"}, cap=1000)
    lines = seen[0].decode("latin-1").split("\r\n")
    assert lines[0] == "GET /metrics?x=1 HTTP/1.1"
    fields = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
    assert fields["host"] == f"127.0.0.1:{port}"
    assert fields["accept"] == "text/plain" and fields["x-team"] == "b" and fields["x-extra"] == "1"
    assert fields["authorization"] == "Basic " + base64.b64encode(b"us@er:p:ss").decode()


async def test_ipv6_literal_host() -> None:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    seen: list[bytes] = []

    async def record(reader: Reader, writer: Writer, conn: int) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(ok())

    async with Script(record, host="::1") as s, client() as c:
        url = s.url
        assert url.startswith("http://[::1]:")
        assert (await c.get(url, cap=1000)).body == BODY
    assert f"\r\nHost: {url.split('/')[2]}\r\n".encode() in seen[0]


async def test_secrets_never_reach_the_warnings(caplog: pytest.LogCaptureFixture) -> None:
    error = b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"
    async with Script(keep_alive(lambda n: error)) as s:
        url = s.url.replace("http://", "http://user:hunter2pass@").removesuffix("/metrics")
        token = "Bearer s3cr3t-t0ken-value"
        src = HttpSource(
            [Endpoint(url, "e", headers={"Authorization": token})],
            discover_roles=False,
            fetch_model_info=False,
        )
        with caplog.at_level(logging.WARNING, logger="fleetscope"):
            (r,) = await src.scrape()
        await src.aclose()
    assert r.error == "HTTP 500"
    text = caplog.text
    assert "HTTP 500" in text and "hunter2pass" not in text and "s3cr3t" not in text


# ------------------------------------------------------------------------------------ TLS


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for 127.0.0.1 / localhost: (ca, cert, key)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, issuer: str, key, signer, *, ca: bool):  # type: ignore[no-untyped-def]
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        else:
            usage = x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            )
            b = b.add_extension(usage, critical=True)
        return b.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build("fleetscope test CA", "fleetscope test CA", ca_key, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build("localhost", "fleetscope test CA", key, ca_key, ca=False)
    paths = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@contextlib.asynccontextmanager
async def tls_server(tmp: Path) -> AsyncIterator[tuple[str, Path]]:
    ca, cert, key = _certificates(tmp)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    server = await asyncio.start_server(_tls_handler, "127.0.0.1", 0, ssl=ctx)
    try:
        yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}", ca
    finally:
        server.close()


async def _tls_handler(reader: Reader, writer: Writer) -> None:
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(ok())
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def test_tls_with_a_custom_ca_verify_false_and_an_untrusted_certificate(
    tmp_path: Path,
) -> None:
    async with tls_server(tmp_path) as (base, ca):
        for verify in (str(ca), False):
            side, wire = new_clients({}, verify, 5.0)
            try:
                for _ in range(2):  # and the TLS connection is reused
                    assert (
                        await fetch_metrics(wire, base + "/metrics", headers={}, cap=1000)
                    ).body == BODY
                assert len(next(iter(wire._idle.values()))) == 1
            finally:
                await wire.aclose()
                await side.aclose()
        side, wire = new_clients({}, True, 5.0)  # the system's CAs do not know ours
        try:
            with pytest.raises(ConnectFailed, match="certificate verify failed") as e:
                await fetch_metrics(wire, base + "/metrics", headers={}, cap=1000)
            assert describe(e.value, 1.0).startswith("connection failed (")
        finally:
            await wire.aclose()
            await side.aclose()


async def test_tls_through_the_http_source(tmp_path: Path) -> None:
    async with tls_server(tmp_path) as (base, ca):
        good = HttpSource([base], verify=str(ca), discover_roles=False, fetch_model_info=False)
        bad = HttpSource([base], discover_roles=False, fetch_model_info=False)
        try:
            (r,) = await good.scrape()
            assert r.ok, r.error
            (r,) = await bad.scrape()
            assert not r.ok and r.error is not None and "certificate verify failed" in r.error
        finally:
            await good.aclose()
            await bad.aclose()
    assert good._client is None and good._wire is None  # both closed
