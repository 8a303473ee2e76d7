"""The shard actors of a :class:`~fleetscope.collector.sharded.source.ShardedSource`: which shard
owns which endpoint, and their supervision.

A shard that dies (its process crashed or was killed, its node stopped) or stops answering for
``restart_after`` seconds is warned about through the driver's logging, naming it and its
endpoints, and started again with the endpoints it owns now, at most ``max_restarts`` times per
shard. A shard with no restarts left is retired: its endpoints go to the live shards (the
emptiest first) at the next poll, and the driver's baselines carry them on. Ray's own actor
restarts are not used: a restarted actor re-runs its constructor with the endpoints it was
first given, and its calls in flight fail anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetscope.collector.sharded.worker import ShardWorker
from fleetscope.fleet.config import CollectorConfig
from fleetscope.sources.base import Endpoint
from fleetscope.util.warn import RateLimitedWarner

log = logging.getLogger("fleetscope")

ActorOptions = Mapping[str, Any] | Sequence[Mapping[str, Any]]
"""``.options()`` of every shard actor, or one mapping per shard (to place each one)."""
NAMED = 8  # endpoints named in a warning; the rest are counted


@dataclass
class ShardSlot:
    """One shard: its current actor (incarnation) and what the driver knows of it."""

    index: int
    handle: Any = None
    started: float = 0.0  # when this incarnation was asked for (driver's monotonic clock)
    incarnation: str | None = None  # learnt from its first reply
    offset: float = 0.0  # driver's monotonic clock - this incarnation's
    call: asyncio.Future[tuple[dict[str, Any], float]] | None = None  # the poll in flight
    sent: float = 0.0  # when ``call`` was sent
    resend: bool = False  # a reply was lost: ask for every layout again
    restarts: int = 0
    retired: bool = False
    add: list[dict[str, Any]] = field(default_factory=list)  # changes for its next poll
    remove: list[str] = field(default_factory=list)


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


def endpoint_dict(e: Endpoint) -> dict[str, Any]:
    d = dataclasses.asdict(e)
    d["headers"] = dict(e.headers)
    d["groups"] = tuple(e.groups)
    return d


def describe(names: Sequence[str]) -> str:
    """``a, b, c`` or ``a, b, ... (40 in all)``."""
    if not names:
        return "no endpoints"
    shown = ", ".join(names[:NAMED])
    return shown if len(names) <= NAMED else f"{shown}, ... ({len(names)} in all)"


class ShardPool:
    """The shard slots, the endpoint -> shard map and the shards' supervision (module doc)."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        shards: int,
        config: CollectorConfig,
        actor_options: ActorOptions | None,
        max_restarts: int,
        warner: RateLimitedWarner,
    ):
        import ray

        self.config = config
        self.max_restarts = max_restarts
        self.warner = warner
        self.restarts_total = 0
        self.run_id = uuid.uuid4().hex[:8]
        self._actor = ray.remote(ShardWorker)
        parts = shard_endpoints(endpoints, shards)
        parts += [[] for _ in range(max(1, shards) - len(parts))]  # room for later additions
        self._options = _per_shard(actor_options, len(parts))
        self.endpoints: dict[str, Endpoint] = {e.name: e for e in endpoints}
        self.owner: dict[str, int] = {e.name: i for i, part in enumerate(parts) for e in part}
        self.slots = [ShardSlot(i) for i in range(len(parts))]
        for slot in self.slots:
            self.start(slot)

    # ------------------------------------------------------------------ ownership

    def owned(self, index: int) -> list[str]:
        """The endpoints shard ``index`` owns, in the fleet's order."""
        return [name for name in self.endpoints if self.owner.get(name) == index]

    def live(self) -> list[ShardSlot]:
        return [s for s in self.slots if not s.retired]

    def add(self, endpoints: Sequence[Endpoint]) -> None:
        """New endpoints go to the emptiest live shards (with their next poll)."""
        for ep in endpoints:
            self.endpoints[ep.name] = ep
        self._assign([ep.name for ep in endpoints])

    def _assign(self, names: Sequence[str]) -> list[str]:
        """Each of ``names`` to the live shard with the fewest endpoints; those placed."""
        live = self.live()
        if not live or not names:
            return []
        load = {s.index: 0 for s in live}
        for owner in self.owner.values():
            if owner in load:
                load[owner] += 1
        for name in names:
            slot = min(live, key=lambda s: load[s.index])
            load[slot.index] += 1
            self.owner[name] = slot.index
            slot.add.append(endpoint_dict(self.endpoints[name]))
        return list(names)

    def remove(self, name: str) -> None:
        """A removed endpoint is dropped by its shard (with its next poll)."""
        self.endpoints.pop(name, None)
        owner = self.owner.pop(name, None)
        if owner is None:
            return
        slot = self.slots[owner]
        pending = [d for d in slot.add if d["name"] != name]
        if len(pending) < len(slot.add):
            slot.add = pending  # never sent: nothing to drop there
        elif not slot.retired:
            slot.remove.append(name)

    def reassign(self) -> list[str]:
        """The endpoints of retired shards, given to the live ones; returns their names."""
        moved = self._assign([n for n, i in self.owner.items() if self.slots[i].retired])
        if moved:
            log.info("fleetscope: %s moved to live shards", describe(moved))
        return moved

    # ------------------------------------------------------------------ supervision

    def start(self, slot: ShardSlot) -> None:
        """A new actor for ``slot`` with the endpoints it owns now (its changes are in them)."""
        eps = [endpoint_dict(self.endpoints[n]) for n in self.owned(slot.index)]
        level = log.getEffectiveLevel()
        # named (unique per source and restart): findable in the dashboard and by ray.get_actor
        name = f"fleetscope-shard{slot.index}-{self.run_id}.{slot.restarts}"
        opts = {"num_cpus": 0, "name": name, **self._options[slot.index]}
        slot.handle = self._actor.options(**opts).remote(slot.index, eps, self.config, level)
        slot.started = time.monotonic()
        slot.incarnation = None
        slot.call = None
        slot.resend = False
        slot.add, slot.remove = [], []

    def lost(self, slot: ShardSlot, why: str) -> None:
        """``slot``'s actor died or hung: warned, killed for good, restarted or retired."""
        names = self.owned(slot.index)
        self.kill(slot)
        head = f"shard {slot.index} ({describe(names)}) {why}"
        if slot.restarts < self.max_restarts:
            slot.restarts += 1
            self.restarts_total += 1
            try:
                self.start(slot)
            except Exception as e:  # Ray refused the new actor: as good as no restart left
                head += f"; its restart failed ({type(e).__name__}: {e})"
            else:
                self.warner.warn(
                    f"shard{slot.index}:lost",
                    f"{head}; restarted it (restart {slot.restarts} of {self.max_restarts}); "
                    "its endpoints count as failed until it answers",
                )
                return
        slot.retired = True
        slot.add, slot.remove = [], []
        where = "the live shards" if self.live() else "no live shard (none is left)"
        self.warner.warn(
            f"shard{slot.index}:retired",
            f"{head}; no restarts left ({self.max_restarts} allowed): its "
            f"{len(names)} endpoint(s) go to {where} at the next poll",
        )

    def kill(self, slot: ShardSlot) -> None:
        import ray

        if slot.call is not None:
            slot.call.cancel()
            slot.call = None
        if slot.handle is not None:
            with contextlib.suppress(Exception):
                ray.kill(slot.handle)
            slot.handle = None

    def keys(self, prefix: str) -> dict[str, float]:
        """The shards' own keys in every row."""
        p = f"{prefix}/collector/"
        return {
            p + "shard_restarts_total": float(self.restarts_total),
            p + "shards_live": float(len(self.live())),
        }


def _per_shard(options: ActorOptions | None, shards: int) -> list[Mapping[str, Any]]:
    if options is None:
        return [{} for _ in range(shards)]
    if isinstance(options, Mapping):
        return [options for _ in range(shards)]
    per = list(options)
    if len(per) != shards:
        raise ValueError(f"actor_options: one mapping per shard ({shards}), not {len(per)}")
    return per
