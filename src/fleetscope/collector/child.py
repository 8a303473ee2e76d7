"""The child process of ``isolation="process"``: a whole collector, driven by the trainer's.

Started as ``python -m fleetscope.collector.child FD`` (see :mod:`fleetscope.collector.process`),
it runs an ordinary in-process :class:`~fleetscope.collector.core.Collector` without sinks and
answers the trainer's commands in order, on one connection: polls, window and sync boundaries,
membership changes, the summary, checkpoints. Each poll's reply is the finished row (the keys
and a light :class:`~fleetscope.fleet.view.FleetView`: no raw bodies, deltas or per-engine inputs)
and the child's state as opaque bytes, which the trainer keeps to restart it from. Warnings are
sent to the trainer's ``fleetscope`` logger.

It lives exactly as long as the trainer's process, whatever thread started it: it watches that
process (:func:`exit_with_parent`) and exits when it dies, and it exits when its connection
closes. SIGINT and SIGTERM sent to the trainer's process group are ignored: the trainer's own
shutdown takes the last poll and the summary through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import pickle
import select
import signal
import sys
import threading
import time
import zlib
from multiprocessing.connection import Connection
from typing import Any

from fleetscope.collector.core import Collector
from fleetscope.exposition import Exposition
from fleetscope.fleet.config import CollectorConfig
from fleetscope.fleet.state import PollResult
from fleetscope.fleet.view import FleetView
from fleetscope.sources.base import Endpoint, MembershipSource

# how often the child checks that the trainer is alive where the kernel cannot tell it at once
# (no pidfd): the most it outlives the trainer there
PARENT_CHECK = 0.5
# how often a regular poll's reply carries the child's state (boundaries always do): the state
# is megabytes at hundreds of engines, and a restart from a state this old only widens the
# unseen gap, which coverage reports
STATE_EVERY = 30.0
_OK_BODY = Exposition({}, None, {}, ())  # stands in for a parsed body: the scrape succeeded


def encode_state(state: dict[str, Any]) -> bytes:
    """The child's state as the trainer keeps it: pickled, then zlib level 1. It is mostly
    repeated NaN markers and shared layouts: ~13x smaller for ~4 ms per MB, so the trainer
    receives (and holds) a fraction of it."""
    return zlib.compress(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), 1)


def decode_state(blob: bytes) -> Any:
    return pickle.loads(zlib.decompress(blob))


class _Channel:
    """Sends pickled messages; any thread (replies from the loop, log records from others)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.conn.send_bytes(data)


class _ForwardLogs(logging.Handler):
    """The child's fleetscope warnings, re-emitted by the trainer's ``fleetscope`` logger."""

    def __init__(self, channel: _Channel):
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.channel.send(("log", record.levelno, record.name, record.getMessage()))


def light_view(view: FleetView) -> FleetView:
    """What the trainer receives of a poll: everything but raw bodies, deltas and inputs."""
    r = view.result
    scrapes = [dataclasses.replace(sc, exposition=_OK_BODY if sc.ok else None) for sc in r.scrapes]
    result = PollResult(
        step=r.step,
        stats=r.stats,
        keys=r.keys,
        deltas={},
        scrapes=scrapes,
        restarts=list(r.restarts),
        wall_time=r.wall_time,
        time=r.time,
        inputs=[],
        events=list(r.events),
        endpoint_info=dict(r.endpoint_info),  # the terminal's RL cells (rl_view.py)
    )
    return dataclasses.replace(view, keys=result.keys, result=result)


class ChildServer:
    """The collector of the child and the commands it answers."""

    def __init__(self, collector: Collector, channel: _Channel):
        self.c = collector
        self.channel = channel
        self._state_at = -math.inf

    def _state(self) -> bytes:
        self._state_at = time.monotonic()
        return encode_state(self.c.state_dict())

    def _state_due(self) -> bytes | None:
        return self._state() if time.monotonic() - self._state_at >= STATE_EVERY else None

    def _roles(self) -> dict[str, str | None]:
        src = self.c.source
        return {e.name: e.role for e in src.endpoints} if isinstance(src, MembershipSource) else {}

    def _row(self, keys: dict[str, float] | None, *, boundary: bool = True) -> tuple[Any, ...]:
        assert self.c.last is not None
        state = self._state() if boundary else self._state_due()
        return (light_view(self.c.last), keys, state, self._roles())

    async def handle(self, kind: str, args: tuple[Any, ...]) -> Any:
        c = self.c
        if kind == "ping":
            return None
        if kind == "poll":
            await c.backend.poll(row_floor=float(args[0]) if args else 0.0)
            return self._row(None, boundary=False)
        if kind == "window":
            action, label = args
            keys = await c.boundaries.window(action, label)
            return self._row(keys)
        if kind == "sync":
            action, token, version, ok = args
            keys = await c.backend.sync(action, token, version, ok=ok)
            return self._row(keys)
        if kind == "change":
            add, remove = args
            if remove:
                c.remove_endpoints(*remove)
            if add:
                c.add_endpoints(*(Endpoint(**d) for d in add))
            return None
        if kind == "policy":
            c.set_policy_version(args[0])
            return None
        if kind == "close_windows":
            await c.backend.close_windows(time.monotonic())
            return self._state()
        if kind == "summary":
            c.run_status = args[0]
            return await c.asummary()
        if kind == "state_dict":
            return c.state_dict()
        if kind == "load_state_dict":
            c.load_state_dict(args[0])
            windows = (sorted(c.windows.active), sorted(c.windows.paused))
            return (*windows, c.policy_version, self._state())
        raise ValueError(f"unknown command {kind!r}")


def build_collector(
    endpoints: list[Endpoint], config: CollectorConfig, sharding: dict[str, Any] | None
) -> Collector:
    """The child's collector: over HTTP, or sharded on the trainer's Ray cluster."""
    if sharding is None:
        return Collector(endpoints, config=config)
    from fleetscope.collector.sharded.collector import child_collector  # imports ray

    return child_collector(endpoints, config, sharding)


async def serve(conn: Connection, init: dict[str, Any]) -> None:
    channel = _Channel(conn)
    log = logging.getLogger("fleetscope")
    log.handlers[:] = [_ForwardLogs(channel)]
    log.propagate = False
    log.setLevel(init["log_level"])
    endpoints = [Endpoint(**d) for d in init["endpoints"]]
    collector = build_collector(endpoints, init["config"], init.get("sharding"))
    if init["state"] is not None:  # a restart: the same run goes on (the gap is unseen)
        collector.pipeline.load_state_dict(decode_state(init["state"]), continuous=True)
        windows = collector.windows
        collector.boundaries.ledger.reset(windows.active, windows.paused)
    if init["policy"] is not None:
        collector.set_policy_version(init["policy"])
    warm = getattr(collector.source, "_ensure_client", None)
    if warm is not None:  # build the HTTP client (TLS bundle) before the first poll's deadline
        with contextlib.suppress(Exception):
            await warm()
    server = ChildServer(collector, channel)
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[bytes | None] = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                data: bytes | None = conn.recv_bytes()
            except (EOFError, OSError):
                data = None
            loop.call_soon_threadsafe(inbox.put_nowait, data)
            if data is None:
                return

    threading.Thread(target=read, name="fleetscope-child-inbox", daemon=True).start()
    channel.send(("ready", os.getpid()))
    while True:
        raw = await inbox.get()
        if raw is None:
            break
        kind, ident, args = pickle.loads(raw)
        if kind == "exit":
            break
        try:
            payload = await server.handle(kind, args)
        except Exception as e:
            channel.send(("error", ident, f"{type(e).__name__}: {e}"))
        else:
            channel.send(("reply", ident, payload))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(collector.backend.aclose(collector.run_status), timeout=5)


def exit_with_parent(parent: int) -> None:
    """Exit as soon as the process ``parent`` (the trainer) has died: a daemon thread watches it.

    Not PR_SET_PDEATHSIG: it fires when the *thread* that started the child exits, not its
    process, so a collector built in a helper thread, or a child restarted by a call from a
    short-lived thread, died with that thread. Nor PDEATHSIG from one long-lived spawner thread
    in the trainer: a thread more in every trainer, kept alive for the child's sake, each restart
    a hand-off to it, Linux only. The connection's end alone is not enough either: a worker the
    trainer forked (a DataLoader's) holds it open after the trainer is gone. So the child watches
    the trainer's process itself: a pidfd (Linux >= 5.3) becomes readable the moment the whole
    process has exited; without one (older kernels, seccomp, macOS), the parent pid changes when
    the trainer dies (the child is reparented), checked every :data:`PARENT_CHECK` seconds.
    """
    poller: select.poll | None = None
    if sys.platform == "linux":
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(parent)
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
    # checked after the pidfd is open: the trainer died before (its pid may even be reused)
    if os.getppid() != parent:
        os._exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            if poller is None:
                time.sleep(PARENT_CHECK)
            elif poller.poll(PARENT_CHECK * 1000):
                break
        os._exit(0)  # nothing to save: the trainer, who kept the state, is gone

    threading.Thread(target=watch, name="fleetscope-child-parent", daemon=True).start()


def main() -> None:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    exit_with_parent(parent)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    conn = Connection(fd)
    init = pickle.loads(conn.recv_bytes())
    asyncio.run(serve(conn, init))
    with contextlib.suppress(Exception):
        conn.close()
    os._exit(0)  # daemon threads (parse pool, inbox) must not delay the exit


if __name__ == "__main__":
    main()
