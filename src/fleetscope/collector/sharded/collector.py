"""``ShardedCollector``: a :class:`~fleetscope.collector.core.Collector` whose scraping and parsing
run in Ray shard actors, its pipeline in this process or (``isolation="process"``, or ``"auto"``
from 256 endpoints) in the isolation child, which joins the trainer's Ray cluster as a driver of
its own and runs the shards from there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fleetscope.collector import process
from fleetscope.collector.backend import Backend
from fleetscope.collector.core import Collector
from fleetscope.collector.inline import InlineBackend
from fleetscope.collector.sharded.pool import ActorOptions
from fleetscope.collector.sharded.source import ShardedSource
from fleetscope.fleet.config import CollectorConfig
from fleetscope.fleet.view import FleetView
from fleetscope.sinks.base import Sink
from fleetscope.sources.base import Endpoint, Source


@dataclass(frozen=True)
class ShardOptions:
    """How a sharded collector shards (what its isolation child needs to do the same)."""

    shards: int = 4
    actor_options: ActorOptions | None = None
    max_restarts: int = 3
    deadline: float | None = None
    restart_after: float | None = None


class ShardedCollector(Collector):
    """A :class:`Collector` whose scraping and parsing run in ``shards`` Ray actors.

    Needs ``ray`` (``pip install "fleetscope[ray]"``) and an initialised Ray (``ray.init``).
    ``actor_options`` go to ``.options()`` of each shard actor (``num_cpus``, scheduling...), or
    one mapping per shard. A shard that dies or hangs is warned about and restarted, at most
    ``max_restarts`` times, then its endpoints go to the live shards; a poll waits at most
    ``deadline`` seconds for its shards (:class:`~fleetscope.collector.sharded.source.
    ShardedSource`). Every other option is a :class:`~fleetscope.fleet.config.CollectorConfig`
    field, and every shard receives the whole config. With ``isolation="process"`` (or
    ``"auto"`` from 256 endpoints) the driver's pipeline runs in the isolation child, which
    joins this process' Ray cluster; ``sharded`` and ``shards`` are then in the child (None, []).
    """

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        shards: int = 4,
        actor_options: ActorOptions | None = None,
        max_restarts: int = 3,
        deadline: float | None = None,
        restart_after: float | None = None,
        config: CollectorConfig | None = None,
        sinks: Sequence[Sink] = (),
        on_poll: Callable[[FleetView], None] | None = None,
        **options: Any,
    ):
        self.shard_options = ShardOptions(
            shards, actor_options, max_restarts, deadline, restart_after
        )
        self.sharded: ShardedSource | None = None
        cfg = (config or CollectorConfig()).with_options(**options)
        super().__init__(endpoints, config=cfg, sinks=sinks, on_poll=on_poll)

    def make_backend(
        self,
        endpoints: Sequence[str | Endpoint],
        source: Source | None,
        config: CollectorConfig,
        *,
        in_child: bool,
    ) -> Backend:
        if in_child:
            cluster = ray_cluster()
            if cluster is not None:
                sharding = {**cluster, "options": asdict(self.shard_options)}
                return process.ProcessBackend(
                    endpoints, config, self._publish, self._warner, sharding=sharding
                )
            if config.isolation == "process":
                raise ValueError(
                    "isolation='process' with shards needs this process connected to a Ray "
                    "cluster by ray.init() (not Ray Client): its child joins the same cluster"
                )
        self.sharded = ShardedSource(endpoints, config=config, **asdict(self.shard_options))
        return InlineBackend(self.sharded, config, self._publish)

    @property
    def shards(self) -> list[Any]:
        """The live shard actors (empty when they run from the isolation child)."""
        return self.sharded.shards if self.sharded is not None else []


def ray_cluster() -> dict[str, Any] | None:
    """How this process is connected to Ray (the isolation child joins the same cluster, in
    the same namespace, with the same runtime environment); None without a local driver
    connection (Ray not initialised, or Ray Client)."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        ctx = ray.get_runtime_context()
        address = ctx.gcs_address
        env = dict(ctx.runtime_env or {})
        namespace = ctx.namespace
    except Exception:  # Ray Client: no local driver to share
        return None
    return {"address": address, "namespace": namespace, "runtime_env": env or None}


def child_collector(
    endpoints: Sequence[Endpoint], config: CollectorConfig, sharding: Mapping[str, Any]
) -> ShardedCollector:
    """The isolation child's collector: it joins the trainer's Ray cluster, then shards."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address=sharding["address"],
            namespace=sharding.get("namespace"),
            runtime_env=sharding.get("runtime_env"),
            log_to_driver=False,  # the shards' records come with their replies
            logging_level=logging.WARNING,
        )
    return ShardedCollector(endpoints, config=config, **sharding["options"])
