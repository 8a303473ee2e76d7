"""One loopback HTTP server for tests that need a hand-made ``/metrics`` (or a side route).

:class:`LoopbackServer` listens on ``127.0.0.1`` on a port the OS picks, in a thread, and answers
each path from ``routes``: a body (``bytes``/``str``), a :class:`Reply`, or a handler called with
the :class:`Request` that returns either (or ``None`` for a 404). Other paths get ``default``
(404 without one). Any method is answered the same way.
``routes`` may be changed at any time (``server.routes["/metrics"] = body``).

The faults tests need are fields of :class:`Reply`: any ``status``, a ``delay`` before the
status line, a body given as an iterable of pieces written one by one (``interval`` seconds
after each: a trickle; an endless iterator: a body that never ends), ``chunked`` framing.
A streamed body stops when the client goes away or the server is closed. Typical use::

    with LoopbackServer({"/metrics": body}) as server:
        c = Collector([server.url], ...)

``server.connections`` counts accepted connections; ``record=True`` keeps every request in
``server.requests`` (off by default: long tests poll thousands of times).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    query: str
    headers: dict[str, str]  # as sent
    body: bytes


@dataclass
class Reply:
    """One response. ``body`` as ``bytes``/``str`` is sent with a Content-Length; as an iterable
    of ``bytes`` it is streamed piece by piece (chunked when ``chunked``, else until the
    connection closes)."""

    body: bytes | str | Iterable[bytes] = b""
    status: int = 200
    content_type: str = TEXT_TYPE
    headers: Mapping[str, str] = field(default_factory=dict)
    chunked: bool = False  # Transfer-Encoding: chunked, one chunk per piece (HTTP/1.1 servers)
    delay: float = 0.0  # seconds before the status line
    interval: float = 0.0  # seconds after each piece of a streamed body


Answer = Reply | bytes | str | None
Route = Reply | bytes | str | Callable[[Request], Answer]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # close() never waits for a handler (an endless body, a hang)
    owner: LoopbackServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.owner._connected()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        owner = self.server.owner
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = Request(self.command, path, query, dict(self.headers.items()), body)
        if owner.record:
            with owner._lock:
                owner.requests.append(request)
        reply = owner._answer(request)
        try:
            self._send(reply)
        except OSError:  # the client went away
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def _send(self, reply: Reply) -> None:
        closed = self.server.owner.closed
        if reply.delay and closed.wait(reply.delay):
            return
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        for k, v in reply.headers.items():
            self.send_header(k, v)
        body = reply.body.encode() if isinstance(reply.body, str) else reply.body
        if isinstance(body, bytes):
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if reply.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:  # the body ends when the connection closes
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        for piece in body:
            if closed.is_set():
                return
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if reply.chunked else piece)
            self.wfile.flush()
            if reply.interval and closed.wait(reply.interval):
                return
        if reply.chunked:
            self.wfile.write(b"0\r\n\r\n")


class LoopbackServer:
    """A threaded HTTP server on ``127.0.0.1:<free port>`` answering from ``routes``.

    ``protocol``: ``"HTTP/1.0"`` (one request per connection) or ``"HTTP/1.1"`` (keep-alive,
    needed for ``chunked`` replies)."""

    def __init__(
        self,
        routes: Mapping[str, Route] | None = None,
        *,
        protocol: str = "HTTP/1.0",
        record: bool = False,
        default: Route | None = None,
    ) -> None:
        self.routes: dict[str, Route] = dict(routes or {})
        self.default = default  # the route of the paths not in ``routes`` (None: 404)
        self.record = record
        self.requests: list[Request] = []
        self.connections = 0
        self.closed = threading.Event()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"protocol_version": protocol})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.owner = self
        self.port: int = self._server.server_address[1]
        self.target = f"127.0.0.1:{self.port}"  # host:port (a Prometheus target)
        self.url = f"http://{self.target}"
        self.metrics_url = f"{self.url}/metrics"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _connected(self) -> None:
        with self._lock:
            self.connections += 1

    def _answer(self, request: Request) -> Reply:
        route = self.routes.get(request.path, self.default)
        answer: Answer = route(request) if callable(route) else route
        if answer is None:
            return Reply(status=404)
        return answer if isinstance(answer, Reply) else Reply(answer)

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()  # streamed bodies and delays stop
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
