"""vLLM metrics read through Ray's per-node metrics agents, filtered to the run's own engines.

Facts this relies on (Ray 2.60, see ``shared/recipes/ray-metrics.md``): every alive node's agent
serves ``http://{NodeManagerAddress}:{MetricsExportPort}/metrics``; vLLM names come as
``ray_vllm_*`` (mapped back to ``vllm:`` by the parser); every sample carries ``WorkerId`` (the
recording actor's worker) and ``ReplicaId`` (Ray Serve); counters never incremented are absent;
gauges expire ~2 report intervals after their last update (missing, never 0); histogram
``_sum`` is rebuilt from bucket midpoints, so means are estimates and token totals come from the
counters. The OpenCensus backend exports counters twice (counted once) and, in its default
cardinality mode, drops ``WorkerId`` from counters and gauges: identity then falls back to
``ReplicaId`` or a run-unique ``model_name``.

Identity filtering keeps only the run's own engines; what it drops is counted and, when it drops
everything, warned about (never silent). A failed identity lookup disables only this source.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetscope._warn import RateLimitedWarner
from fleetscope.exposition import Exposition
from fleetscope.fleet import ScrapeResult
from fleetscope.sources.http import Endpoint, HttpSource
from fleetscope.stats.reduce import Role

log = logging.getLogger("fleetscope")

IDENTITY_LOOKUP_TIMEOUT = 10.0
# model_name is part of the key so a run-unique model name can identify engines when the
# OpenCensus backend drops WorkerId
RAY_AGENT_IDENTITY = ("ReplicaId", "WorkerId", "model_name", "engine")


def discover_agents(nodes: Iterable[Mapping] | None = None) -> list[Endpoint]:
    """One endpoint per alive node's metrics agent (``ray.nodes()`` unless ``nodes`` given).

    Names are ``node{i}`` in the order of the node ids, so a node keeps its name while alive.
    """
    if nodes is None:
        import ray

        nodes = ray.nodes()
    alive = [
        n
        for n in nodes
        if (n.get("Alive") or n.get("alive")) and n.get("MetricsExportPort") and n.get("NodeID")
    ]
    alive.sort(key=lambda n: n["NodeID"])
    return [
        Endpoint(
            url=f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}",
            name=f"node-{n['NodeID'][:8]}",
        )
        for n in alive
    ]


def worker_ids_of_actors(actors: Sequence, timeout: float = IDENTITY_LOOKUP_TIMEOUT) -> list[str]:
    """Worker ids of actor handles, through Ray's state API (actor -> node+pid -> worker).

    Bounded by ``timeout``; raises ``TimeoutError`` or ``LookupError`` when it cannot finish.
    """
    from ray.util.state import get_actor, list_workers

    deadline = time.monotonic() + timeout
    out = []
    for a in actors:
        left = max(1, int(deadline - time.monotonic()))
        if time.monotonic() > deadline:
            raise TimeoutError("worker id lookup timed out")
        actor_id = a._actor_id.hex()
        st = get_actor(actor_id, timeout=left)
        if st is None or st.pid is None:
            raise LookupError(f"actor {actor_id} not found or not alive")
        workers = list_workers(
            filters=[("pid", "=", int(st.pid)), ("node_id", "=", st.node_id)],
            timeout=left,
        )
        if not workers:
            raise LookupError(f"no worker for actor {actor_id} (pid {st.pid})")
        out.append(workers[0].worker_id)
    return out


@dataclass
class RayIdentity:
    """Which samples are the run's own: by worker id, replica id or model name.

    ``roles`` maps an identity value (worker id, replica id, model name) to its role.
    """

    worker_ids: set[str] = field(default_factory=set)
    replica_ids: set[str] = field(default_factory=set)
    model_names: set[str] = field(default_factory=set)
    roles: dict[str, Role] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.worker_ids or self.replica_ids or self.model_names)


class RaySource:
    """Scrapes every node's metrics agent and keeps only the run's own engines.

    Engine labels become ``{worker id[:8]}-{engine}`` (or the replica id / model name when that is
    the identity), so engine ids read ``node-5f904afd.ea26d7d6-0``.

    Args:
        identity: the run's own engines; or ``identity_lookup``, a callable returning one,
            run with a time bound in a thread (a failure disables this source, logged once).
        nodes: a callable returning ``ray.nodes()``-like dicts (default ``ray.nodes``),
            re-read every ``rediscover_every`` polls so nodes that come and go are followed.
    """

    def __init__(
        self,
        identity: RayIdentity | None = None,
        *,
        identity_lookup: Callable[[], RayIdentity] | None = None,
        nodes: Callable[[], Iterable[Mapping]] | None = None,
        rediscover_every: int = 12,
        http: HttpSource | None = None,
        lookup_timeout: float = IDENTITY_LOOKUP_TIMEOUT,
    ):
        self.identity = identity
        self._lookup = identity_lookup
        self._nodes = nodes
        self.rediscover_every = max(1, rediscover_every)
        self.http = http or HttpSource(identity_labels=RAY_AGENT_IDENTITY)
        self.lookup_timeout = lookup_timeout
        self.endpoints: list[Endpoint] = []
        self.disabled: str | None = None
        self.foreign_engines = 0
        self._polls = 0
        self._warner = RateLimitedWarner(log, prefix="fleetscope: ")

    async def _ensure_identity(self) -> bool:
        if self.identity is not None:
            return True
        if self._lookup is None:
            self.disabled = "no identity given: refusing to count every actor's samples"
            return False
        try:
            self.identity = await asyncio.wait_for(
                asyncio.to_thread(self._lookup), timeout=self.lookup_timeout
            )
            return True
        except Exception as e:
            self.disabled = f"identity lookup failed: {type(e).__name__}: {e}"
            log.warning("fleetscope: Ray metrics disabled (%s)", self.disabled)
            return False

    async def aclose(self) -> None:
        await self.http.aclose()

    async def discover(self) -> list[Endpoint]:
        try:
            nodes = self._nodes() if self._nodes is not None else None
            if nodes is None:
                nodes = await asyncio.to_thread(_ray_nodes)
            self.endpoints = discover_agents(nodes)
        except Exception as e:
            self._warner.warn("discover", f"Ray node discovery failed: {e!r}")
        return self.endpoints

    async def scrape_all(self) -> list[ScrapeResult]:
        """One poll: every agent, filtered to the run's own engines."""
        if self.disabled or not await self._ensure_identity():
            return []
        if not self.endpoints or self._polls % self.rediscover_every == 0:
            await self.discover()
        self._polls += 1
        results = await self.http.scrape_all(self.endpoints)
        out = []
        kept_total = 0
        foreign = 0
        for r in results:
            if r.exposition is None:
                out.append(r)
                continue
            expo, roles, dropped = self.filter(r.exposition)
            kept_total += len(expo)
            foreign += dropped
            out.append(
                ScrapeResult(
                    r.endpoint, expo, r.time, r.wall_time, r.latency, None, None, (), roles
                )
            )
        self.foreign_engines = foreign
        if any(r.ok for r in results) and kept_total == 0:
            self._warner.warn(
                "filtered-all",
                f"Ray agents answered but none of their {foreign} vLLM engines is this run's "
                "own (identity filter removed everything); check the worker/replica ids",
            )
        return out

    def filter(self, expo: Exposition) -> tuple[Exposition, dict[str, Role], int]:
        """Keep the run's own engines; relabel them ``{id[:8]}-{engine}``."""
        ident = self.identity or RayIdentity()
        kept = {}
        roles: dict[str, Role] = {}
        dropped = 0
        for label, snap in expo.items():
            parts = label.split("/")
            engine = parts[-1]
            ids = parts[:-1]
            own = next((v for v in ids if v in ident.worker_ids or v in ident.replica_ids), None)
            if own is None:  # OpenCensus default cardinality: no WorkerId; model_name tells
                own = next((v for v in ids if v in ident.model_names), None)
            if own is None:
                dropped += 1
                continue
            new_label = f"{own[:8]}-{engine}"
            while new_label in kept:  # same engine split by a backend that drops WorkerId
                new_label += "'"
            kept[new_label] = snap
            role = ident.roles.get(own)
            if role:
                roles[new_label] = role
        return Exposition(kept, None, expo.types), roles, dropped


def _ray_nodes():
    import ray

    return ray.nodes()
