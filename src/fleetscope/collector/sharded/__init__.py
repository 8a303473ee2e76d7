"""Sharded scraping on Ray: shard actors scrape and parse, the driver runs the one pipeline.

A :class:`ShardedSource` is a :class:`~fleetscope.sources.base.Source` whose endpoints are split
over Ray shard actors (:mod:`.worker`); the driver turns their packed replies back into the
scrapes an HTTP source gives (:mod:`.source`), so deltas, windows, the run summary, health and
keys are exactly one collector's. Parsing, the CPU-heavy part, runs in the actors, in parallel.
Shards are supervised (:mod:`.pool`): a shard that dies or hangs is warned about and restarted
within a budget, then its endpoints go to the live shards; a poll never waits for a shard longer
than its deadline; the shards' warnings reach the driver's logging. :class:`ShardedCollector`
(:mod:`.collector`) runs the driver's pipeline in this process or in the isolation child.
"""

from fleetscope.collector.sharded.collector import ShardedCollector, ShardOptions
from fleetscope.collector.sharded.pool import shard_endpoints
from fleetscope.collector.sharded.source import ShardedSource
from fleetscope.collector.sharded.worker import ShardWorker

__all__ = ["ShardOptions", "ShardWorker", "ShardedCollector", "ShardedSource", "shard_endpoints"]
