"""The driver's side of sharded scraping: shard actors scrape and parse, this source turns their
packed replies back into the :class:`~fleetscope.sources.base.ScrapeResult` values an HTTP
source gives, so the one pipeline on the driver computes exactly one collector's statistics.

Each poll asks every live shard once (the fleet changes for it ride with the call) and waits at
most ``deadline`` seconds: a shard that has not answered by then, or is still busy with an
earlier poll, counts as failed for this poll (its endpoints' scrapes failed), so a slow or hung
shard never makes a poll longer. Shards may run on other nodes: their monotonic clocks are
translated to the driver's with one fixed offset per shard incarnation (measured at its first
reply), so intervals stay exact. Departures and ``joined`` flags are the driver's own, so they
survive a shard's restart and an endpoint's move to another shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleetscope.collector.sharded.pool import ActorOptions, ShardPool, ShardSlot
from fleetscope.collector.sharded.worker import LogLine, Packed
from fleetscope.exposition import Exposition, InvalidSeries
from fleetscope.exposition.snapshot import EngineLayout, EngineSnapshot
from fleetscope.fleet.config import CollectorConfig
from fleetscope.identity import Role
from fleetscope.sources.base import Departure, Endpoint, ScrapeResult
from fleetscope.sources.http.membership import EndpointSet, Members
from fleetscope.util.warn import RateLimitedWarner

log = logging.getLogger("fleetscope")

Reply = tuple[dict[str, Any], float]  # a shard's reply and when it arrived (driver's clock)


def default_deadline(config: CollectorConfig) -> float:
    """A poll's wait for its shards: the scrape deadline plus room to parse and to reply."""
    return config.timeout + max(1.0, config.timeout / 2)


def default_restart_after(config: CollectorConfig) -> float:
    """How long a shard may go without answering before it is killed and restarted (the
    isolation child's rule)."""
    return max(60.0, 4 * config.timeout)


class ShardedSource(Members):
    """Endpoints scraped by Ray shard actors (see the module doc). Needs an initialised Ray.

    ``max_restarts``: restarts per shard before its endpoints go to the live shards;
    ``deadline``: the longest a poll waits for its shards (default :func:`default_deadline`;
    the first poll waits up to ``restart_after`` for the shards to start);
    ``restart_after``: a shard silent that long is killed and restarted (default
    :func:`default_restart_after`). ``actor_options`` go to every shard actor's ``.options()``
    (or one mapping per shard).
    """

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        shards: int = 4,
        config: CollectorConfig | None = None,
        actor_options: ActorOptions | None = None,
        max_restarts: int = 3,
        deadline: float | None = None,
        restart_after: float | None = None,
    ):
        self.config = config or CollectorConfig()
        self.members = EndpointSet(endpoints)
        self.deadline = deadline if deadline is not None else default_deadline(self.config)
        self.restart_after = (
            restart_after if restart_after is not None else default_restart_after(self.config)
        )
        self.warner = RateLimitedWarner(log, prefix="fleetscope: ")
        self.pool = ShardPool(
            self.members.endpoints,
            shards=shards,
            config=self.config,
            actor_options=actor_options,
            max_restarts=max_restarts,
            warner=self.warner,
        )
        self._layouts: dict[str, EngineLayout] = {}
        self._departures: list[Departure] = []
        self._joining: set[str] = set()  # added, not scraped yet: their first result joins
        self._last_time: dict[str, float] = {}  # endpoint -> its last result's time
        self._polled = False
        self.max_model_len: dict[str, int | None] = {}

    @property
    def shards(self) -> list[Any]:
        """The live shards' actor handles, in shard order."""
        return [s.handle for s in self.pool.live()]

    def take_departures(self) -> list[Departure]:
        out, self._departures = self._departures, []
        return out

    def collector_keys(self, prefix: str) -> dict[str, float]:
        """Restarts and live shards, in every row (``{prefix}/collector/...``)."""
        return self.pool.keys(prefix)

    # ------------------------------------------------------------------ one poll

    def _apply_changes(self) -> None:
        added, removed = self.members.apply()
        for name in removed:
            self.pool.remove(name)
            self.max_model_len.pop(name, None)
            self._joining.discard(name)
            self._departures.append(Departure(endpoint=name, time=self._last_time.pop(name, None)))
        self.pool.add(added)
        self._joining.update(e.name for e in added)

    def _send(self, slot: ShardSlot, now: float) -> None:
        ref = slot.handle.poll.remote(slot.resend, slot.add, slot.remove)
        slot.call = asyncio.ensure_future(_arrival(ref))
        slot.sent = now
        slot.add, slot.remove = [], []

    def _ask(self, now: float, out: dict[str, ScrapeResult]) -> dict[int, ShardSlot]:
        """Send this poll to every live shard that is free; a busy one fails this poll (and
        is restarted once it has been silent ``restart_after`` seconds)."""
        asked: dict[int, ShardSlot] = {}
        for slot in self.pool.slots:
            if slot.retired:
                out.update(self._failed(slot, "is retired and no live shard is left"))
                continue
            if slot.call is not None and not slot.call.done():
                silent = now - slot.sent
                if silent < self.restart_after:
                    out.update(self._failed(slot, f"is busy with a poll sent {silent:.1f} s ago"))
                    continue
                out.update(self._failed(slot, f"did not answer for {silent:.0f} s"))
                self.pool.lost(slot, f"did not answer for {silent:.0f} s: killed it")
                if slot.retired:
                    continue
            elif slot.call is not None:
                self._harvest(slot)  # a reply that came after its poll's deadline
            self._send(slot, now)
            asked[slot.index] = slot
        return asked

    async def scrape(self) -> list[ScrapeResult]:
        t0 = time.monotonic()
        self._apply_changes()
        self.pool.reassign()
        out: dict[str, ScrapeResult] = {}
        asked = self._ask(t0, out)
        wait = self.deadline if self._polled else max(self.deadline, self.restart_after)
        calls = [s.call for s in asked.values() if s.call is not None]
        if calls:
            await asyncio.wait(calls, timeout=max(0.0, t0 + wait - time.monotonic()))
        self._polled = True
        for slot in asked.values():
            fut = slot.call
            if fut is None or not fut.done():
                slot.resend = True  # its reply may carry layouts: ask for all of them again
                out.update(self._failed(slot, f"did not answer within {wait:g} s"))
                continue
            slot.call = None
            err = None if fut.cancelled() else fut.exception()
            if err is not None or fut.cancelled():
                out.update(self._failed(slot, _summary(err)))
                self._on_error(slot, err)
                continue
            out.update(self._receive(slot, *fut.result()))
        # in the endpoints' order: rows, and every float sum over them, as one collector's
        return [self._finish(out[e.name]) for e in self.endpoints if e.name in out]

    def _on_error(self, slot: ShardSlot, err: BaseException | None) -> None:
        import ray.exceptions as rex

        if isinstance(err, rex.ActorUnavailableError):  # unreachable for now, not dead
            slot.resend = True
            self.warner.warn(f"shard{slot.index}:unavailable", f"shard {slot.index} unreachable")
        elif isinstance(err, rex.RayActorError | rex.ActorUnschedulableError):
            self.pool.lost(slot, f"died ({_summary(err)})")
        else:
            slot.resend = True
            self.warner.warn(f"shard{slot.index}:failed", f"shard {slot.index}: {_summary(err)}")

    def _finish(self, sc: ScrapeResult) -> ScrapeResult:
        """The driver's own ``joined`` flag (an endpoint moved to another shard has not
        joined the fleet; one added while its shard restarted has) and last scrape time."""
        joined = sc.endpoint in self._joining
        self._joining.discard(sc.endpoint)
        self._last_time[sc.endpoint] = sc.time
        return sc if sc.joined == joined else dataclasses.replace(sc, joined=joined)

    # ------------------------------------------------------------------ replies

    def _learn(self, slot: ShardSlot, reply: dict[str, Any], arrived: float) -> None:
        """What every reply teaches, on time or late: layouts, log records, the offset."""
        if reply["incarnation"] != slot.incarnation:
            slot.incarnation = reply["incarnation"]
            slot.offset = clock_offset(slot.sent, reply.get("received"), reply["now"], arrived)
            # earlier incarnations' tokens are never sent again (their layouts stay alive in
            # the baselines that use them)
            ours, keep = f"{slot.index}.", f"{slot.index}.{slot.incarnation}:"
            for tok in [t for t in self._layouts if t.startswith(ours) and not t.startswith(keep)]:
                del self._layouts[tok]
        self._layouts.update(reply["layouts"])
        self._relay(slot, reply["logs"])

    def _harvest(self, slot: ShardSlot) -> None:
        fut, slot.call = slot.call, None
        if fut is None or fut.cancelled() or fut.exception() is not None:
            return  # it failed after its poll gave up on it: the next call tells why
        reply, arrived = fut.result()
        self._learn(slot, reply, arrived)
        slot.resend = False  # its layouts are here after all

    def _relay(self, slot: ShardSlot, lines: list[LogLine]) -> None:
        """A shard's log records, through the driver's logging (warnings rate-limited)."""
        for level, name, kind, message in lines:
            if level >= logging.WARNING:
                self.warner.warn(f"shard:{kind}", f"{message} (shard {slot.index})")
            else:
                logging.getLogger(name).log(level, "fleetscope: %s (shard %d)", message, slot.index)

    def _receive(
        self, slot: ShardSlot, reply: dict[str, Any], arrived: float
    ) -> dict[str, ScrapeResult]:
        self._learn(slot, reply, arrived)
        slot.resend = False
        self.max_model_len.update(reply["max_model_len"])
        self._note_roles(reply["roles"])
        out: dict[str, ScrapeResult] = {}
        for meta, engines, types, invalid in reply["scrapes"]:
            name = meta["endpoint"]
            if self.pool.owner.get(name) != slot.index:
                continue  # removed or moved since
            if engines is not None and any(e[1] not in self._layouts for e in engines):
                slot.resend = True  # cannot happen unless a reply was lost unseen
                out[name] = self._error(name, "layout lost; resent")
                continue
            out[name] = self._unpack(meta, engines, types, invalid, slot.offset)
        return out

    def _unpack(
        self,
        meta: dict[str, Any],
        engines: list[Packed] | None,
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

    def _error(self, name: str, error: str) -> ScrapeResult:
        ep = self.pool.endpoints.get(name)
        role, groups = (ep.role, ep.groups) if ep is not None else (None, ())
        now = time.monotonic()
        return ScrapeResult(name, None, now, time.time(), error=error, role=role, groups=groups)

    def _failed(self, slot: ShardSlot, why: str) -> dict[str, ScrapeResult]:
        """A shard that did not answer: its endpoints' scrapes failed this poll."""
        return {n: self._error(n, f"shard {slot.index} {why}") for n in self.pool.owned(slot.index)}

    def _note_roles(self, roles: Mapping[str, Role | None]) -> None:
        """Roles a shard discovered."""
        current = {e.name: e.role for e in self.members.endpoints}
        for name, role in roles.items():
            if role is not None and name in current and current[name] != role:
                self.members.set_role(name, role)

    # ------------------------------------------------------------------ lifecycle

    async def wait_ready(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until every live shard has started."""
        refs = [_arrival(s.handle.where.remote()) for s in self.pool.live()]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*refs, return_exceptions=True), timeout)

    async def aclose(self) -> None:
        live = self.pool.live()

        async def close(slot: ShardSlot) -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_arrival(slot.handle.close.remote()), timeout=5)

        await asyncio.gather(*(close(s) for s in live))
        for s in self.pool.slots:
            self.pool.kill(s)
            s.retired = True

    async def settings(self) -> list[dict[str, Any]]:
        """Every live shard's HTTP settings (what it was really built with)."""
        replies = await asyncio.gather(
            *(_arrival(s.handle.settings.remote()) for s in self.pool.live())
        )
        return [r for r, _ in replies]

    async def where(self) -> list[dict[str, Any]]:
        """Every live shard's node, process, incarnation and endpoints."""
        replies = await asyncio.gather(
            *(_arrival(s.handle.where.remote()) for s in self.pool.live())
        )
        return [
            {"shard": s.index, **r} for s, (r, _) in zip(self.pool.live(), replies, strict=True)
        ]


def clock_offset(sent: float, received: float | None, replied: float, arrived: float) -> float:
    """The driver's monotonic clock minus a shard's, from one call (NTP's estimate): sent and
    arrived on the driver's clock, received and replied on the shard's. Off by half the
    difference between the two one-way delays at most; ``arrived - replied`` alone was off by
    the whole reply delay (seconds on a loaded machine: a shard's times then landed in the
    driver's future, and an engine that failed at a window's stop was expected for no time)."""
    if received is None or sent <= 0.0:
        return arrived - replied
    return ((sent - received) + (arrived - replied)) / 2.0


async def _arrival(ref: Any) -> tuple[Any, float]:
    """A Ray call's result and when it arrived here."""
    result = await ref
    return result, time.monotonic()


def _summary(err: BaseException | None) -> str:
    if err is None:
        return "cancelled"
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first}" if first else type(err).__name__
