"""Sharded collection on Ray: collector actors scrape shards, the driver merges exact parts.

Each shard actor owns a contiguous slice of the endpoints, their parsers and baselines. Per poll
it scrapes, computes per-engine deltas and returns a :class:`~fleetscope.stats.reduce.Partial`:
per-engine metric rows (what min / max / median / mean need), the increases and ratio parts
behind rates and pooled values, and per-scope histogram bucket sums. The driver merges the parts
in endpoint order and finishes the reduction, so it logs exactly the keys one collector would
log for the same scrapes. Parsing — the CPU-heavy part — runs in the actors, in parallel.

Windows are a single-collector feature: a sharded driver logs per-poll keys and health.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from fleetscope.collector import Collector
from fleetscope.exposition import Exposition
from fleetscope.fleet import FleetState, PollResult, ScrapeResult
from fleetscope.sources.http import Endpoint, HttpSource
from fleetscope.stats.reduce import Partial, partial_reduce

_EMPTY = Exposition({}, None, {})


class ShardWorker:
    """The body of one shard actor (plain class; wrapped with ``ray.remote`` on demand)."""

    def __init__(self, endpoints: list[dict[str, Any]], timeout: float, max_concurrency: int):
        self.endpoints = [Endpoint(**e) for e in endpoints]
        self.source = HttpSource(timeout=timeout, max_concurrency=max_concurrency)
        self.state = FleetState()

    async def poll(self) -> tuple[Partial, list[ScrapeResult], list[str]]:
        scrapes = await self.source.scrape_all(self.endpoints)
        inputs, _deltas, restarts = await asyncio.to_thread(self.state.fold, scrapes)
        part = await asyncio.to_thread(partial_reduce, inputs)
        # the driver needs each scrape's outcome, not its snapshots
        meta = [
            ScrapeResult(
                sc.endpoint,
                _EMPTY if sc.ok else None,
                sc.time,
                sc.wall_time,
                sc.latency,
                sc.error,
                sc.role,
                sc.groups,
            )
            for sc in scrapes
        ]
        return part, meta, restarts

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


class ShardedCollector(Collector):
    """A :class:`Collector` whose scraping and per-engine work runs in ``shards`` Ray actors.

    Needs ``ray`` (``pip install "fleetscope[ray]"``) and an initialised Ray (``ray.init``).
    ``actor_options`` go to ``.options()`` of each shard actor (``num_cpus``, scheduling...).
    """

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        shards: int = 4,
        actor_options: dict[str, Any] | None = None,
        max_concurrency: int = 64,
        **kwargs: Any,
    ):
        kwargs.setdefault("fetch_model_info", False)
        kwargs.setdefault("discover_roles", False)
        super().__init__(endpoints, max_concurrency=max_concurrency, **kwargs)
        import ray

        remote_cls = ray.remote(ShardWorker)
        opts = {"num_cpus": 0, **(actor_options or {})}
        self.shards = [
            remote_cls.options(**opts).remote(
                [_endpoint_dict(e) for e in part], self.timeout, max_concurrency
            )
            for part in shard_endpoints(self.endpoints, shards)
        ]

    async def _collect(self) -> PollResult:
        replies = await asyncio.gather(*(s.poll.remote() for s in self.shards))
        partials = [p for p, _, _ in replies]
        scrapes = [sc for _, meta, _ in replies for sc in meta]
        restarts = [r for _, _, rs in replies for r in rs]
        for r in restarts:
            self.state.restarts[r] = self.state.restarts.get(r, 0) + 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.source._pool,
            lambda: self.state.finish(partials, scrapes, restarts=restarts),
        )

    async def stop(self, status: str | None = None, *, timeout: float = 30.0) -> None:
        await super().stop(status, timeout=timeout)
        import ray

        for s in self.shards:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.close.remote(), timeout=5)
            ray.kill(s)
        self.shards = []


def _endpoint_dict(e: Endpoint) -> dict[str, Any]:
    d = asdict(e)
    d["headers"] = dict(e.headers)
    d["groups"] = tuple(e.groups)
    return d
