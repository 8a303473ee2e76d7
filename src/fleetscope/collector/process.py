"""``isolation="process"``: the same :class:`~fleetscope.collector.core.Collector`, with its work in a
supervised child process, so a trainer's event loop and GIL pay almost nothing for it.

The trainer's process keeps what must live there: the poll schedule, window and weight-sync
handles, the sinks (a ``WandbSink(run=...)`` writes into the trainer's own run) and ``on_poll``.
The child (:mod:`fleetscope.collector.child`, started with :mod:`subprocess` rather than
:mod:`multiprocessing`, whose spawn would re-run the trainer's ``__main__``) scrapes, parses,
and computes deltas, reductions, windows, health and keys. Per poll the trainer receives one
message, the finished row, decoded on a reader thread; views (``last``, ``on_poll``) are light:
``view.result`` has the reduced statistics, keys, events and scrape outcomes, but no raw
bodies, deltas or per-engine inputs.

Supervision: boundary replies, and a poll reply every 30 s, carry the child's state as bytes the
trainer keeps without decoding. If the child dies (or stops answering within
``max(60 s, 4 x timeout)``) it is restarted from that state with the current endpoints and
policy version, the command in flight is sent again once, and the trainer is told: a warning
and ``{prefix}/collector/child_restarts_total``. Open windows continue from the saved poll:
what happened since (counted by the dead child, or before the new one's fresh baselines) is not
in their sums, and their coverage says so. The child never outlives the trainer
(PR_SET_PDEATHSIG; it also exits when its connection closes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
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
from typing import Any, cast

import fleetscope
from fleetscope.collector.core import Collector
from fleetscope.fleet.config import ISOLATION_AUTO_ENDPOINTS, CollectorConfig
from fleetscope.fleet.view import FleetView
from fleetscope.identity import Role
from fleetscope.rl.weight_sync import WeightSyncHandle
from fleetscope.sinks.base import Sink
from fleetscope.sources.base import Departure, ScrapeResult, Source
from fleetscope.sources.http.membership import Endpoint, EndpointSet, Members

log = logging.getLogger("fleetscope")


def wants_process(endpoints: Sequence[object], options: Mapping[str, Any]) -> bool:
    """Whether ``Collector(endpoints, **options)`` runs its work in a child process."""
    cfg = options.get("config")
    mode = options.get("isolation") or (cfg or CollectorConfig()).isolation
    return mode == "process" or (mode == "auto" and len(endpoints) >= ISOLATION_AUTO_ENDPOINTS)


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

    def __init__(self, endpoints: Sequence[str | Endpoint], config: CollectorConfig):
        self.members = EndpointSet(endpoints)
        self.config = dataclasses.replace(config, isolation="inline")
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


class IsolatedCollector(Collector):
    """A :class:`Collector` whose scraping and statistics run in a child process (module doc).
    Built by ``Collector(..., isolation="process")``; the API is the same."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint] = (),
        *,
        source: Source | None = None,
        config: CollectorConfig | None = None,
        sinks: Sequence[Sink] = (),
        on_poll: Callable[[FleetView], None] | None = None,
        **options: Any,
    ):
        if source is not None:
            raise ValueError("isolation='process' scrapes endpoints over HTTP: give endpoints")
        self.config = (config or CollectorConfig()).with_options(**options)
        self.link = ChildLink(endpoints, self.config)
        self.source = self.link
        self._init_loop(sinks, on_poll)
        self._final: tuple[dict[str, Any], dict[str, Any]] | None = None  # after stop()
        self.link.call("ping")  # the child imports and builds its collector from now on

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the child process is up (its start-up is otherwise in the first poll)."""
        await asyncio.wait_for(asyncio.wrap_future(self.link.call("ping")), timeout)

    # ------------------------------------------------------------------ commands

    @property
    def _reply_deadline(self) -> float:
        return max(60.0, 4 * self.timeout)

    async def _ask(self, kind: str, *args: Any) -> Any:
        """A command's reply; a dead or hung child is restarted and asked once more."""
        for attempt in (0, 1):
            fut = self.link.call(kind, *args)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(fut), self._reply_deadline)
            except TimeoutError:
                self._warner.warn(
                    "child-hung",
                    f"the collector's child process did not answer in {self._reply_deadline:g} "
                    "s: killed it",
                )
                self.link.kill()
            except ChildUnavailable:
                if attempt:
                    raise
        raise ChildUnavailable("the collector's child process did not answer")

    def _ask_blocking(self, kind: str, *args: Any) -> Any:
        """:meth:`_ask` for synchronous callers (any thread: the reply is resolved by the
        link's reader thread, never by an event loop)."""
        for attempt in (0, 1):
            try:
                return self.link.call(kind, *args).result(self._reply_deadline)
            except concurrent.futures.TimeoutError:
                self.link.kill()
            except ChildUnavailable:
                if attempt:
                    raise
        raise ChildUnavailable("the collector's child process did not answer")

    async def _row(self, kind: str, *args: Any) -> tuple[FleetView, dict[str, float]]:
        """A command that takes a poll: publish its row here, as an in-process poll does."""
        if self._poll_lock is None:
            self._poll_lock = asyncio.Lock()
        async with self._poll_lock:
            t0 = time.monotonic()
            view, keys, state, roles = await self._ask(kind, *args)
            self.link.keep_state(state)
            self.link.note_roles(roles)
            self._publish(view, t0)
            return view, keys or {}

    async def _poll(self, before_log: Any = None) -> FleetView:
        assert before_log is None  # boundaries go to the child whole (_boundary below)
        try:
            view, _ = await self._row("poll")
        except ChildUnavailable as e:
            self._warner.warn("child-poll", f"poll skipped: {e}")
            if self.last is None:
                raise
            return self.last
        return view

    async def _boundary(self, action: str, label: str) -> dict[str, float]:
        _, keys = await self._row("window", action, label)
        if action in ("start", "stop"):
            self.fanout.window(action, label)
        return keys

    async def _sync_boundary(
        self, action: str, handle: WeightSyncHandle, *, ok: bool = True
    ) -> dict[str, float]:
        if action == "exit" and ok:
            self.link.policy = handle.version
        _, keys = await self._row("sync", action, handle.token, handle.version, ok)
        return keys

    async def _close_windows(self, now: float) -> None:
        self.link.keep_state(await self._ask("close_windows"))

    async def _close_source(self) -> None:
        # what an in-process collector still answers after stop(): kept from the child's last
        # answers before it exits
        with contextlib.suppress(Exception):
            self._final = (
                await self._ask("summary", self.run_status),
                await self._ask("state_dict"),
            )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.link.aclose(), timeout=15)

    async def _close_rl(self) -> None:
        return None

    @property
    def policy_version(self) -> str | None:
        return self.link.policy

    def set_policy_version(self, version: str) -> None:
        if not isinstance(version, str):
            raise TypeError(f"a policy version is a string, not {type(version).__name__}")
        self.link.policy = version
        self.link.call("policy", version)

    # ------------------------------------------------------------------ summary and state

    def summary(self) -> dict[str, float | str]:
        if self._final is not None:
            return {**self._final[0], "run_status": self.run_status}
        return cast(dict[str, float | str], self._ask_blocking("summary", self.run_status))

    async def asummary(self) -> dict[str, float | str]:
        if self._final is not None:
            return self.summary()
        return cast(dict[str, float | str], await self._ask("summary", self.run_status))

    def state_dict(self) -> dict[str, Any]:
        if self._final is not None:
            return copy.deepcopy(self._final[1])
        return cast(dict[str, Any], self._ask_blocking("state_dict"))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        active, paused, policy, blob = self._ask_blocking("load_state_dict", dict(state))
        self.link.keep_state(blob)
        self.link.policy = policy
        self._ledger.active, self._ledger.paused = set(active), set(paused)

    def _collector_keys(self) -> dict[str, float]:
        out = super()._collector_keys()
        out[f"{self._prefix}/collector/child_restarts_total"] = float(self.link.restarts)
        return out
