"""The trainer's end of ``isolation="process"``'s child: the child process, its connection and
its supervision (:mod:`fleetscope.collector.process` has the whole picture)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import fleetscope
from fleetscope.fleet.config import CollectorConfig
from fleetscope.identity import Role
from fleetscope.sources.base import Departure, Endpoint, ScrapeResult
from fleetscope.sources.http.membership import EndpointSet, Members

log = logging.getLogger("fleetscope")


class ChildUnavailable(RuntimeError):
    """The child process died or stopped answering (it is restarted on the next command)."""


class _Child:
    """One child process and its connection; a reader thread resolves replies."""

    def __init__(self, on_message: Callable[[_Child, tuple[Any, ...]], None]):
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        # the child imports the same fleetscope as this process, wherever it was found
        root = os.path.dirname(os.path.dirname(os.path.abspath(fleetscope.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "fleetscope.collector.child"]
        self.proc = subprocess.Popen(
            [*cmd, str(theirs.fileno()), str(os.getpid())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self.alive = True
        self._send_lock = threading.Lock()
        self._on_message = on_message
        self._reader = threading.Thread(target=self._read, name="fleetscope-child", daemon=True)
        self._reader.start()

    def send(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self.conn.send_bytes(data)

    def _read(self) -> None:
        while True:
            try:
                message = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError, pickle.UnpicklingError):
                break
            self._on_message(self, message)
        self.alive = False
        self._on_message(self, ("dead",))

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()

    def close(self, timeout: float) -> None:
        with contextlib.suppress(Exception):
            self.send(("exit", -1, ()))
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(5)
        with contextlib.suppress(Exception):
            self.conn.close()


class ChildLink(Members):
    """The trainer's end: endpoints named here, commands in order, the child supervised."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        config: CollectorConfig,
        *,
        sharding: Mapping[str, Any] | None = None,
    ):
        self.members = EndpointSet(endpoints)
        self.config = dataclasses.replace(config, isolation="inline")
        self.sharding = dict(sharding) if sharding is not None else None
        self.restarts = 0
        self.policy: str | None = None
        self._state: bytes | None = None  # the child's last state, never decoded here
        self._child: _Child | None = None
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.RLock()
        self._failures = 0  # deaths since the last answer (restart backoff)
        self._next_spawn = 0.0
        self._closed = False

    # the Source protocol, for the collector's membership methods; the child does the scraping
    async def scrape(self) -> list[ScrapeResult]:
        raise RuntimeError("in isolation mode the child process scrapes")

    def take_departures(self) -> list[Departure]:
        return []

    def call(self, kind: str, *args: Any) -> concurrent.futures.Future[Any]:
        """Send a command (after any membership change); its reply resolves the future."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            try:
                child = self._ensure_child()
                self._send_changes(child)
                ident = next(self._ids)
                self._pending[ident] = fut
                child.send((kind, ident, args))
            except Exception as e:
                fut.set_exception(ChildUnavailable(f"{type(e).__name__}: {e}"))
        return fut

    def _ensure_child(self) -> _Child:
        if self._closed:
            raise ChildUnavailable("the collector is closed")
        if self._child is not None and self._child.alive:
            return self._child
        now = time.monotonic()
        if now < self._next_spawn:
            raise ChildUnavailable(f"restarting in {self._next_spawn - now:.0f} s")
        restart = self._child is not None
        self.members.apply()
        child = _Child(self._on_message)
        child.send(
            {
                "endpoints": [_endpoint_dict(e) for e in self.members.endpoints],
                "config": self.config,
                "sharding": self.sharding,
                "state": self._state,
                "policy": self.policy,
                "log_level": log.getEffectiveLevel(),
            }
        )
        self._child = child
        if restart:
            self.restarts += 1
            log.warning(
                "fleetscope: the collector's child process died; restarted it (%d restart(s) so "
                "far) from its last state: counts since its last poll are not seen",
                self.restarts,
            )
        return child

    def _send_changes(self, child: _Child) -> None:
        added, removed = self.members.apply()
        if added or removed:
            ident = next(self._ids)
            child.send(("change", ident, ([_endpoint_dict(e) for e in added], sorted(removed))))

    def _on_message(self, child: _Child, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "log":
            logging.getLogger(message[2]).log(message[1], "%s", message[3])
            return
        if kind == "dead":
            with self._lock:
                if child is self._child:
                    self._failures += 1
                    self._next_spawn = time.monotonic() + min(30.0, 2.0 ** (self._failures - 1) - 1)
                    pending, self._pending = self._pending, {}
                else:
                    pending = {}
            code: int | None
            try:  # its connection is closed: it has exited or is exiting; collect its status
                code = child.proc.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.proc.poll()
            for waiting in pending.values():
                if not waiting.done():
                    waiting.set_exception(ChildUnavailable(f"the child process exited ({code})"))
            return
        if kind not in ("reply", "error"):
            return
        with self._lock:
            fut = self._pending.pop(message[1]) if message[1] in self._pending else None
            self._failures = 0
        if fut is None or fut.done():
            return
        if kind == "error":
            fut.set_exception(RuntimeError(f"collector child: {message[2]}"))
        else:
            fut.set_result(message[2])

    @property
    def pid(self) -> int | None:
        """The child process' id (None before it starts; a restarted child has a new one)."""
        child = self._child
        return child.proc.pid if child is not None else None

    def keep_state(self, state: bytes | None) -> None:
        if state is not None:
            self._state = state

    def note_roles(self, roles: Mapping[str, Role | None]) -> None:
        current = {e.name: e.role for e in self.members.endpoints}
        for name, role in roles.items():
            if role is not None and name in current and current[name] != role:
                self.members.set_role(name, role)

    def kill(self) -> None:
        with self._lock:
            if self._child is not None:
                self._child.kill()

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._closed = True
            child, self._child = self._child, None
        if child is not None:
            child.close(timeout)

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)


def _endpoint_dict(e: Endpoint) -> dict[str, Any]:
    d = dataclasses.asdict(e)
    d["headers"] = dict(e.headers)
    d["groups"] = tuple(e.groups)
    return d
