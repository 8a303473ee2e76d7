"""Serve a simulated fleet over HTTP on loopback: one port per endpoint, one asyncio loop.

``FleetServer(fleet).start()`` runs an asyncio event loop in a background thread with one
``asyncio.start_server`` listener per endpoint on ``127.0.0.1`` and a minimal HTTP/1.1 handler
(keep-alive, ``Content-Length``, ``GET``/``HEAD``). Routes:

* ``GET /metrics`` -- the endpoint's exposition with its faults applied
  (``SimEndpoint.metrics_response``), ``Content-Type: text/plain; version=0.0.4; charset=utf-8``;
* ``GET /v1/models`` -- OpenAI-style model list with ``max_model_len``;
* ``GET /get_metrics_worker_info`` -- ``{"worker_id": "...", "role": null|"prefill"|"decode"}``;
* ``GET /health`` -- 200, empty body;
* ``GET /version`` (vLLM: ``{"version": "0.32.0"}``) and, for SGLang endpoints,
  ``GET /server_info`` / ``/get_server_info`` / ``/model_info`` (SGLang 0.5.23 has no
  ``/version``): ``SimEndpoint.json_route``;
* vLLM's RL routes (``GET /weight_info``, ``POST /update_weight_version``, ``POST /pause``,
  ``POST /resume``, ``GET /is_paused``, ``GET /is_sleeping``, ``POST /sleep``, ``POST
  /wake_up``, ``POST /release_kv_cache_memory`` and the weight-transfer calls): see
  :mod:`fleetscope_sim.rl`. A call held by ``SimRL.hold`` is awaited without blocking
  the loop (other requests, ``/metrics`` included, are answered meanwhile).

Bodies are rendered once per step (cached by the endpoint) and computed in a worker thread, so
a fleet step in progress never blocks the event loop. One process comfortably serves 256
endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from types import TracebackType
from typing import Any

from .endpoint import SimEndpoint
from .fleet import SimFleet
from .rl import PendingCall

HOST = "127.0.0.1"
_JSON = "application/json"
_TEXT = "text/plain; charset=utf-8"


def _status_line(status: int) -> str:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return f"HTTP/1.1 {status} {phrase}\r\n"


def _head(status: int, content_type: str, length: int, keep_alive: bool) -> bytes:
    return (
        _status_line(status)
        + f"Content-Type: {content_type}\r\n"
        + f"Content-Length: {length}\r\n"
        + f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
        + "Server: fleetscope-sim\r\n\r\n"
    ).encode("latin-1")


class FleetServer:
    """Serve every endpoint of a ``SimFleet`` on its own loopback port.

    Args:
        fleet: the fleet (endpoints added after ``start()`` are served once
            ``serve_new_endpoints()`` is called).
        port_base: endpoint ``i`` listens on ``port_base + i``; ``None`` lets the OS choose.
        step_interval: if set, a background thread calls ``fleet.step(real elapsed seconds)``
            every ``step_interval`` seconds (simulated time then tracks real time).
        keepalive_timeout: idle keep-alive connections are closed after this many seconds.

    Use as a context manager or ``start()`` / ``stop()``. ``urls`` lists the base URLs
    (``http://127.0.0.1:PORT``) in endpoint order; ``metrics_urls`` the ``/metrics`` ones.
    """

    def __init__(
        self,
        fleet: SimFleet,
        *,
        port_base: int | None = None,
        step_interval: float | None = None,
        keepalive_timeout: float = 75.0,
    ) -> None:
        self.fleet = fleet
        self.port_base = port_base
        self.step_interval = step_interval
        self.keepalive_timeout = keepalive_timeout
        self.ports: list[int] = []
        self._endpoints: list[SimEndpoint] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: dict[int, asyncio.base_events.Server] = {}
        self._tasks: dict[int, set[asyncio.Task[Any]]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._stepper: threading.Thread | None = None
        self._stop_stepping = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        """Base URL of each endpoint, in ``fleet.endpoints`` order."""
        return [f"http://{HOST}:{port}" for port in self.ports]

    @property
    def metrics_urls(self) -> list[str]:
        """``/metrics`` URL of each endpoint."""
        return [f"{url}/metrics" for url in self.urls]

    def url(self, name: str) -> str:
        """Base URL of the endpoint called ``name``."""
        return f"http://{HOST}:{self.ports[self._index(name)]}"

    def _index(self, name: str) -> int:
        for i, endpoint in enumerate(self._endpoints):
            if endpoint.name == name:
                return i
        raise KeyError(name)

    def _run(self, coro: Any) -> Any:
        if self._loop is None:
            raise RuntimeError("server not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def serve_new_endpoints(self) -> list[str]:
        """Start listening for endpoints added to the fleet since ``start()`` (a fleet that grows
        mid-run); returns their base URLs."""
        with self.fleet.lock:
            new = [ep for ep in self.fleet.endpoints if ep not in self._endpoints]
        urls = []
        for endpoint in new:
            self._endpoints.append(endpoint)
            index = len(self._endpoints) - 1
            port = 0 if self.port_base is None else self.port_base + index
            self.ports.append(self._run(self._listen(index, port)))
            self._hook_restarts(index)
            urls.append(self.url(endpoint.name))
        return urls

    def close_endpoint(self, name: str) -> None:
        """Stop listening on that endpoint's port and drop its connections: scrapes now get
        *connection refused* (a dead server). ``open_endpoint`` brings it back."""
        self._run(self._close(self._index(name)))

    def open_endpoint(self, name: str) -> None:
        """Listen again on the endpoint's port after ``close_endpoint``."""
        index = self._index(name)
        if index not in self._servers:
            self._run(self._listen(index, self.ports[index]))

    def start(self) -> FleetServer:
        """Bind every port and start serving (returns once all listeners are up)."""
        if self._thread is not None:
            raise RuntimeError("already started")
        self._endpoints = list(self.fleet.endpoints)
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fleetscope-sim")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name="fleetscope-sim-http", daemon=True
        )
        self._thread.start()
        try:
            self.ports = self._run(self._start_servers())
            for index in range(len(self._endpoints)):
                self._hook_restarts(index)
        except BaseException:
            self.stop()
            raise
        if self.step_interval:
            self._stop_stepping.clear()
            self._stepper = threading.Thread(
                target=self._step_loop, name="fleetscope-sim-step", daemon=True
            )
            self._stepper.start()
        return self

    def stop(self) -> None:
        """Stop stepping, close every listener and connection, join the thread."""
        self._stop_stepping.set()
        if self._stepper is not None:
            self._stepper.join(timeout=10)
            self._stepper = None
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        if loop is not None and not loop.is_running():
            loop.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._loop = self._thread = self._executor = None

    def __enter__(self) -> FleetServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _step_loop(self) -> None:
        assert self.step_interval
        last = time.monotonic()
        while not self._stop_stepping.wait(self.step_interval):
            now = time.monotonic()
            self.fleet.step(now - last)
            last = now

    async def _start_servers(self) -> list[int]:
        ports = []
        for i in range(len(self._endpoints)):
            ports.append(await self._listen(i, 0 if self.port_base is None else self.port_base + i))
        return ports

    def _drop_connections(self, index: int) -> None:
        """The endpoint's process restarted: its successor holds none of the old connections
        (clients see them closed, as after a real restart)."""
        for task in list(self._tasks.get(index, ())):
            task.cancel()

    def _hook_restarts(self, index: int) -> None:
        endpoint = self._endpoints[index]

        def restarted() -> None:
            loop = self._loop
            if loop is not None and loop.is_running():
                loop.call_soon_threadsafe(self._drop_connections, index)

        endpoint.restart_hooks.append(restarted)

    async def _listen(self, index: int, port: int) -> int:
        endpoint = self._endpoints[index]
        tasks = self._tasks.setdefault(index, set())

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await self._serve_connection(endpoint, reader, writer)
            finally:
                tasks.discard(task)

        server = await asyncio.start_server(handle, HOST, port, reuse_address=True, backlog=512)
        self._servers[index] = server
        return int(server.sockets[0].getsockname()[1])

    async def _close(self, index: int) -> None:
        server = self._servers.pop(index, None)
        if server is not None:
            server.close()
        tasks = list(self._tasks.get(index, ()))
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=5)

    async def _shutdown(self) -> None:
        await asyncio.gather(*(self._close(i) for i in list(self._servers)))

    # -- HTTP -----------------------------------------------------------------------------------
    async def _serve_connection(
        self, endpoint: SimEndpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            keep_alive = True
            while keep_alive:
                try:
                    head = await asyncio.wait_for(
                        reader.readuntil(b"\r\n\r\n"), timeout=self.keepalive_timeout
                    )
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                    break
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3:
                    writer.write(_head(400, _TEXT, 0, False))
                    await writer.drain()
                    break
                method, target, version = parts
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if ":" in line:
                        key, value = line.split(":", 1)
                        headers[key.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(length) if length else b""
                connection = headers.get("connection", "").lower()
                if version == "HTTP/1.1":
                    keep_alive = connection != "close"
                else:
                    keep_alive = connection == "keep-alive"
                path, _, query = target.partition("?")
                keep_alive = await self._respond(
                    endpoint, method, path, writer, keep_alive, body, query
                )
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(
        self,
        endpoint: SimEndpoint,
        method: str,
        path: str,
        writer: asyncio.StreamWriter,
        keep_alive: bool,
        body: bytes = b"",
        query: str = "",
    ) -> bool:
        """Write one response; return whether the connection stays open."""
        rl = endpoint.rl.answer(method, path, body, query)
        if isinstance(rl, PendingCall):  # held in its handler: in flight until released
            while not rl.released:
                await asyncio.sleep(0.002)
            rl = rl.finish()
        if rl is not None:
            data = json.dumps(rl[1]).encode()
            return await self._send(writer, rl[0], _JSON, data, keep_alive, method)
        if method not in ("GET", "HEAD"):
            return await self._send(writer, 405, _TEXT, b"Method Not Allowed\n", keep_alive, method)
        extra = endpoint.json_route(path)  # per engine kind (/version, /server_info ...)
        if extra is not None:
            data = json.dumps(extra[1]).encode()
            return await self._send(writer, extra[0], _JSON, data, keep_alive, method)
        if path == "/metrics":
            loop = asyncio.get_running_loop()
            response = await loop.run_in_executor(self._executor, endpoint.metrics_response)
            if response.delay_seconds > 0:
                await asyncio.sleep(response.delay_seconds)
            if response.disconnect:
                return False
            if response.declared_length is not None:
                writer.write(_head(200, response.content_type, response.declared_length, True))
                if method != "HEAD":
                    writer.write(response.body)
                await writer.drain()
                return False
            return await self._send(
                writer,
                response.status,
                response.content_type,
                response.body,
                keep_alive,
                method,
            )
        if path == "/v1/models":
            body = json.dumps(endpoint.models_json()).encode()
            return await self._send(writer, 200, _JSON, body, keep_alive, method)
        if path == "/get_metrics_worker_info":
            body = json.dumps(endpoint.worker_info()).encode()
            return await self._send(writer, 200, _JSON, body, keep_alive, method)
        if path == "/health":
            return await self._send(writer, 200, _TEXT, b"", keep_alive, method)
        return await self._send(writer, 404, _JSON, b'{"detail":"Not Found"}', keep_alive, method)

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter,
        status: int,
        content_type: str,
        body: bytes,
        keep_alive: bool,
        method: str,
    ) -> bool:
        writer.write(_head(status, content_type, len(body), keep_alive))
        if method != "HEAD" and body:
            writer.write(body)
        await writer.drain()
        return keep_alive
