"""The body of one shard actor: an HTTP source over its endpoints, its polls packed compactly,
its log records kept for the driver.

A shard runs an :class:`~fleetscope.sources.http.source.HttpSource` built from the collector's
whole :class:`~fleetscope.fleet.config.CollectorConfig` (headers, TLS, body cap, timeouts, role
discovery, model info: nothing can be dropped). Each poll's snapshots travel compactly: a layout
is sent once per incarnation of the shard (its token names the shard, the incarnation and a
counter, so a restarted shard never reuses a token), then only values. Its ``fleetscope`` log
records (the source's rate-limited warnings, with their kinds) ride back with each reply, so the
driver relays them to its own logging instead of leaving them in Ray's actor output.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np

from fleetscope.exposition.snapshot import EngineLayout
from fleetscope.fleet.config import CollectorConfig
from fleetscope.sources.base import Endpoint, ScrapeResult
from fleetscope.sources.http.source import HttpSource
from fleetscope.util.warn import WARN_KIND

# (label, layout token, values, process start, invalid series) of one engine ("" label: the
# endpoint's row)
Packed = tuple[str, str, np.ndarray, float | None, frozenset[str]]
# one log record of a shard: (level, logger name, warning kind, message)
LogLine = tuple[int, str, str, str]
MAX_LOG_LINES = 256  # kept between two replies; older ones are dropped (and counted)
PREFIX = "fleetscope: "  # the warners' prefix: the driver's warner adds its own


class LogRelay(logging.Handler):
    """The shard's ``fleetscope`` log records, kept until the next reply carries them."""

    def __init__(self, maxlen: int = MAX_LOG_LINES) -> None:
        super().__init__()
        self.lines: deque[LogLine] = deque(maxlen=maxlen)
        self.dropped = 0
        self._lock = threading.Lock()  # records come from the loop and the parse thread

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage().removeprefix(PREFIX)
        except Exception:  # a malformed record is not worth a shard
            return
        kind = getattr(record, WARN_KIND, None) or f"{record.name}:{message[:80]}"
        with self._lock:
            if len(self.lines) == self.lines.maxlen:
                self.dropped += 1
            self.lines.append((record.levelno, record.name, str(kind), message))

    def take(self) -> list[LogLine]:
        with self._lock:
            out = list(self.lines)
            self.lines.clear()
            dropped, self.dropped = self.dropped, 0
        if dropped:
            note = f"{dropped} older log record(s) of this shard were dropped"
            out.append((logging.WARNING, "fleetscope", "relay-dropped", note))
        return out


def install_relay(level: int) -> LogRelay:
    """Send this process' ``fleetscope`` records to a :class:`LogRelay` only (a shard actor's
    process is its own: Ray's forwarded output would print them a second time)."""
    relay = LogRelay()
    log = logging.getLogger("fleetscope")
    log.handlers[:] = [relay]
    log.propagate = False
    log.setLevel(level)
    return relay


class ShardWorker:
    """The body of one shard actor (plain class; wrapped with ``ray.remote`` by the driver).

    ``log_level``: the driver's ``fleetscope`` level; given, the records are relayed to the
    driver (see the module doc); None (in-process use) leaves logging alone.
    """

    def __init__(
        self,
        index: int,
        endpoints: list[dict[str, Any]],
        config: CollectorConfig,
        log_level: int | None = None,
    ):
        self.index = index
        self.incarnation = uuid.uuid4().hex[:12]
        self.relay = install_relay(log_level) if log_level is not None else None
        self.config = config
        self.source = HttpSource([Endpoint(**e) for e in endpoints], **config.http_options())
        self._tokens: dict[int, str] = {}  # id(layout) -> token already sent
        self._kept: list[EngineLayout] = []  # keeps sent layouts alive (their ids stay theirs)

    def settings(self) -> dict[str, Any]:
        """What this shard's HTTP source was built with (for checks and diagnostics)."""
        src = self.source
        return {
            "timeout": src.timeout,
            "max_body_bytes": src.max_body_bytes,
            "headers": dict(src._headers),
            "verify": src._verify,
            "discover_roles": src.discover_roles,
            "fetch_model_info": src.fetch_model_info,
            "group_by_model": self.config.group_by_model,
        }

    def where(self) -> dict[str, Any]:
        """Where this shard runs: its Ray node, process and incarnation; its endpoints."""
        import ray

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "incarnation": self.incarnation,
            "endpoints": [e.name for e in self.source.endpoints],
        }

    def change(self, add: Sequence[Mapping[str, Any]], remove: Sequence[str]) -> None:
        """The driver's fleet changes for this shard (named there), before its next poll."""
        if remove:
            self.source.remove_endpoints(*remove)
        if add:
            self.source.add_endpoints(*(Endpoint(**d) for d in add))

    def _token(self, layout: EngineLayout, new: dict[str, EngineLayout]) -> str:
        tok = self._tokens.get(id(layout))
        if tok is None:
            tok = f"{self.index}.{self.incarnation}:{len(self._tokens)}"
            self._tokens[id(layout)] = tok
            self._kept.append(layout)
            new[tok] = layout
        return tok

    async def poll(
        self,
        resend: bool = False,
        add: Sequence[Mapping[str, Any]] = (),
        remove: Sequence[str] = (),
    ) -> dict[str, Any]:
        """The fleet changes ``add`` / ``remove``, then one poll's packed scrapes. ``resend``:
        the driver lost a reply (past its deadline), so it may lack layouts that reply carried:
        send every layout again."""
        received = time.monotonic()  # with "now": the driver's estimate of our clock's offset
        self.change(add, remove)
        scrapes = await self.source.scrape()
        self.source.take_departures()  # the driver reports departures itself
        new: dict[str, EngineLayout] = {}
        if resend:
            new.update({self._tokens[id(lay)]: lay for lay in self._kept})
        packed = [self._pack(sc, new) for sc in scrapes]
        return {
            "incarnation": self.incarnation,
            "scrapes": packed,
            "layouts": new,
            "roles": {e.name: e.role for e in self.source.endpoints},
            "max_model_len": dict(self.source.max_model_len),
            "logs": self.relay.take() if self.relay is not None else [],
            "received": received,
            "now": time.monotonic(),
        }

    def _pack(self, sc: ScrapeResult, new: dict[str, EngineLayout]) -> tuple[Any, ...]:
        engines: list[Packed] | None = None
        types: Mapping[str, str] = {}
        if sc.exposition is not None:
            expo = sc.exposition
            types = expo.types
            engines = [
                (label, self._token(s.layout, new), s.data, s.process_start, s.invalid)
                for label, s in expo.items()
            ]
            if expo.endpoint is not None:
                s = expo.endpoint
                engines.append(("", self._token(s.layout, new), s.data, s.process_start, s.invalid))
        meta = {f.name: getattr(sc, f.name) for f in fields(sc) if f.name != "exposition"}
        meta["engine_roles"] = dict(sc.engine_roles)
        invalid = sc.exposition.invalid if sc.exposition is not None else ()
        return (meta, engines, dict(types), invalid)

    async def close(self) -> None:
        await self.source.aclose()
