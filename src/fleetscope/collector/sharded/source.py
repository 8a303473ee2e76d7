"""Sharded scraping on Ray: shard actors scrape and parse, the driver runs the one pipeline.

A :class:`ShardedSource` is a :class:`~fleetscope.sources.base.Source` whose endpoints are split
over ``shards`` Ray actors. Each shard runs an :class:`~fleetscope.sources.http.source.HttpSource`
built from the collector's whole :class:`~fleetscope.fleet.config.CollectorConfig` (headers, TLS,
body cap, timeouts, role discovery, model info: nothing can be dropped) and returns each poll's
snapshots compactly: a layout is sent once per shard, then only values travel. The driver turns
them back into the same :class:`~fleetscope.sources.base.ScrapeResult` values an HTTP source
gives, so deltas, windows, the run summary, health and keys are exactly one collector's.
Parsing, the CPU-heavy part, runs in the actors, in parallel.

Shards may run on other nodes: their monotonic clocks are translated to the driver's with one
fixed offset per shard (measured at its first reply), so intervals stay exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any

import numpy as np

from fleetscope.collector.core import Collector
from fleetscope.exposition import Exposition, InvalidSeries
from fleetscope.exposition.snapshot import EngineLayout, EngineSnapshot
from fleetscope.fleet.config import CollectorConfig
from fleetscope.identity import Role
from fleetscope.sources.base import Departure, Endpoint, ScrapeResult
from fleetscope.sources.http.membership import EndpointSet, Members
from fleetscope.sources.http.source import HttpSource

# (label, layout token, values, process start, invalid series) of one engine ("" label: the
# endpoint's row)
_Packed = tuple[str, str, np.ndarray, float | None, frozenset[str]]


class ShardWorker:
    """The body of one shard actor (plain class; wrapped with ``ray.remote`` on demand)."""

    def __init__(self, index: int, endpoints: list[dict[str, Any]], config: CollectorConfig):
        self.index = index
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

    def change(self, add: list[dict[str, Any]], remove: list[str]) -> None:
        """The driver's fleet changes for this shard (named there), before its next poll."""
        if remove:
            self.source.remove_endpoints(*remove)
        if add:
            self.source.add_endpoints(*(Endpoint(**d) for d in add))

    def _token(self, layout: EngineLayout, new: dict[str, EngineLayout]) -> str:
        tok = self._tokens.get(id(layout))
        if tok is None:
            tok = self._tokens[id(layout)] = f"{self.index}:{len(self._tokens)}"
            self._kept.append(layout)
            new[tok] = layout
        return tok

    async def poll(self, resend: bool = False) -> dict[str, Any]:
        """One poll's packed scrapes. ``resend``: the driver lost a reply (a timeout), so it may
        lack layouts that reply carried: send every layout again."""
        scrapes = await self.source.scrape()
        new: dict[str, EngineLayout] = {}
        if resend:
            new.update({self._tokens[id(lay)]: lay for lay in self._kept})
        packed = []
        for sc in scrapes:
            engines: list[_Packed] | None = None
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
                    tok = self._token(s.layout, new)
                    engines.append(("", tok, s.data, s.process_start, s.invalid))
            meta = {f.name: getattr(sc, f.name) for f in fields(sc) if f.name != "exposition"}
            meta["engine_roles"] = dict(sc.engine_roles)
            invalid = sc.exposition.invalid if sc.exposition is not None else ()
            packed.append((meta, engines, dict(types), invalid))
        return {
            "scrapes": packed,
            "layouts": new,
            "roles": {e.name: e.role for e in self.source.endpoints},
            "max_model_len": dict(self.source.max_model_len),
            "departures": [(d.endpoint, d.time) for d in self.source.take_departures()],
            "now": time.monotonic(),
        }

    async def close(self) -> None:
        await self.source.aclose()


def shard_endpoints(endpoints: Sequence[Endpoint], shards: int) -> list[list[Endpoint]]:
    """Contiguous, balanced slices (keeps the single collector's row order when merged)."""
    shards = max(1, min(shards, len(endpoints)))
    size, extra = divmod(len(endpoints), shards)
    out, start = [], 0
    for i in range(shards):
        stop = start + size + (1 if i < extra else 0)
        out.append(list(endpoints[start:stop]))
        start = stop
    return out


class ShardedSource(Members):
    """Endpoints scraped by Ray shard actors (see the module doc). Needs an initialised Ray."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        shards: int = 4,
        config: CollectorConfig | None = None,
        actor_options: Mapping[str, Any] | None = None,
    ):
        import ray

        self.config = config or CollectorConfig()
        self.members = EndpointSet(endpoints)
        parts = shard_endpoints(self.members.endpoints, shards)
        parts += [[] for _ in range(max(1, shards) - len(parts))]  # room for later additions
        self._owner = {e.name: i for i, part in enumerate(parts) for e in part}
        remote_cls = ray.remote(ShardWorker)
        opts = {"num_cpus": 0, **(actor_options or {})}
        self.shards: list[Any] = [
            remote_cls.options(**opts).remote(i, [_endpoint_dict(e) for e in part], self.config)
            for i, part in enumerate(parts)
        ]
        self._layouts: dict[str, EngineLayout] = {}
        self._resend: set[int] = set()  # shards whose last reply was lost (layouts with it)
        self._offsets: dict[int, float] = {}
        self._departures: list[Departure] = []
        self.max_model_len: dict[str, int | None] = {}

    def take_departures(self) -> list[Departure]:
        out, self._departures = self._departures, []
        return out

    async def _send_changes(self) -> None:
        """Removals go to the shard that owns them, additions to the emptiest shard."""
        added, removed = self.members.apply()
        if not (added or removed):
            return
        changes: dict[int, tuple[list[dict[str, Any]], list[str]]] = {}
        for name in removed:
            i = self._owner.pop(name)
            changes.setdefault(i, ([], []))[1].append(name)
            self.max_model_len.pop(name, None)
        load = [0] * len(self.shards)
        for i in self._owner.values():
            load[i] += 1
        for ep in added:
            i = min(range(len(self.shards)), key=load.__getitem__)
            load[i] += 1
            self._owner[ep.name] = i
            changes.setdefault(i, ([], []))[0].append(_endpoint_dict(ep))
        await asyncio.gather(
            *(self.shards[i].change.remote(add, rm) for i, (add, rm) in changes.items())
        )

    async def scrape(self) -> list[ScrapeResult]:
        await self._send_changes()
        replies = await asyncio.gather(
            *(
                asyncio.wait_for(_ref(s.poll.remote(i in self._resend)), self.config.timeout * 4)
                for i, s in enumerate(self.shards)
            ),
            return_exceptions=True,
        )
        received = time.monotonic()
        by_name: dict[str, ScrapeResult] = {}
        for i, reply in enumerate(replies):
            if isinstance(reply, BaseException):
                self._resend.add(i)
                by_name.update(self._shard_failed(i, reply))
                continue
            self._resend.discard(i)
            offset = self._offsets.setdefault(i, received - reply["now"])
            self._layouts.update(reply["layouts"])
            self.max_model_len.update(reply["max_model_len"])
            for name, role in reply["roles"].items():
                self._note_role(name, role)
            for name, t in reply["departures"]:
                if name in self._owner:
                    continue  # re-added since
                self._departures.append(
                    Departure(endpoint=name, time=None if t is None else t + offset)
                )
            for meta, engines, types, invalid in reply["scrapes"]:
                if engines is not None and any(e[1] not in self._layouts for e in engines):
                    self._resend.add(i)  # cannot happen unless a reply was lost unseen
                    by_name[meta["endpoint"]] = self._lost_layout(meta)
                    continue
                sc = self._unpack(meta, engines, types, invalid, offset)
                by_name[sc.endpoint] = sc
        # in the endpoints' order: rows, and every float sum over them, as one collector's
        return [by_name[e.name] for e in self.endpoints if e.name in by_name]

    def _unpack(
        self,
        meta: dict[str, Any],
        engines: list[_Packed] | None,
        types: Mapping[str, str],
        invalid: tuple[InvalidSeries, ...],
        offset: float,
    ) -> ScrapeResult:
        t = meta["time"] + offset
        expo = None
        if engines is not None:
            snaps: dict[str, EngineSnapshot] = {}
            endpoint_row = None
            for label, tok, data, pstart, bad in engines:
                snap = EngineSnapshot(
                    label, self._layouts[tok], data, t, meta["wall_time"], pstart, bad
                )
                if label == "":
                    endpoint_row = snap
                else:
                    snaps[label] = snap
            expo = Exposition(snaps, endpoint_row, types, invalid)
        return ScrapeResult(**{**meta, "time": t, "exposition": expo})

    def _lost_layout(self, meta: dict[str, Any]) -> ScrapeResult:
        now = time.monotonic()
        return ScrapeResult(meta["endpoint"], None, now, time.time(), error="layout lost; resent")

    def _shard_failed(self, i: int, error: BaseException) -> dict[str, ScrapeResult]:
        """A shard that did not answer: its endpoints' scrapes failed this poll."""
        now, wall = time.monotonic(), time.time()
        return {
            name: ScrapeResult(name, None, now, wall, error=f"shard {i} failed: {error!r}")
            for name, owner in self._owner.items()
            if owner == i
        }

    def _note_role(self, name: str, role: Role | None) -> None:
        current = next((e for e in self.members.endpoints if e.name == name), None)
        if current is not None and role is not None and current.role != role:
            self.members.set_role(name, role)

    async def aclose(self) -> None:
        import ray

        for s in self.shards:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_ref(s.close.remote()), timeout=5)
            with contextlib.suppress(Exception):
                ray.kill(s)
        self.shards = []

    async def settings(self) -> list[dict[str, Any]]:
        """Every shard's HTTP settings (what it was really built with)."""
        return list(await asyncio.gather(*(_ref(s.settings.remote()) for s in self.shards)))


class ShardedCollector(Collector):
    """A :class:`Collector` whose scraping and parsing run in ``shards`` Ray actors.

    Needs ``ray`` (``pip install "fleetscope[ray]"``) and an initialised Ray (``ray.init``).
    ``actor_options`` go to ``.options()`` of each shard actor (``num_cpus``, scheduling...).
    Every other option is a :class:`~fleetscope.fleet.config.CollectorConfig` field, and every shard
    receives the whole config.
    """

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        shards: int = 4,
        actor_options: dict[str, Any] | None = None,
        config: CollectorConfig | None = None,
        sinks: Sequence[Any] = (),
        on_poll: Any = None,
        **options: Any,
    ):
        cfg = (config or CollectorConfig()).with_options(**options)
        source = ShardedSource(endpoints, shards=shards, config=cfg, actor_options=actor_options)
        super().__init__(source=source, config=cfg, sinks=sinks, on_poll=on_poll)
        self.sharded = source

    @property
    def shards(self) -> list[Any]:
        return self.sharded.shards


async def _ref(ref: Any) -> Any:
    return await ref


def _endpoint_dict(e: Endpoint) -> dict[str, Any]:
    d = asdict(e)
    d["headers"] = dict(e.headers)
    d["groups"] = tuple(e.groups)
    return d
