"""Every option of a collector in one value, so a collector, its child process or its shards
receive the same options whole and none can be dropped on the way."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetscope.exposition import MAX_BODY_BYTES
from fleetscope.health import HealthThresholds
from fleetscope.keys import DEFAULT_KEY_BUDGET, KeyOptions, Schema

Isolation = Literal["inline", "process", "auto"]
# fleets this large run in a child process under isolation="auto" (benchmarks/bench_poll.py)
ISOLATION_AUTO_ENDPOINTS = 256


@dataclass(frozen=True)
class CollectorConfig:
    """Options of a :class:`~fleetscope.collector.core.Collector` (and of every shard).

    Args:
        interval: seconds between polls; the schedule does not drift by the poll's duration.
        timeout: total deadline of one scrape (connect, send, read, parse excluded).
        max_concurrency: scrapes in flight at once.
        max_body_bytes: a larger body is a failed scrape (read stops at the cap).
        headers: sent with every request (e.g. ``Authorization``).
        verify: TLS verification: True, False or a CA bundle path.
        schema: ``"prime-rl"`` (default keys) or ``"skyrl"``.
        key_budget: per-poll keys before per-engine keys are cut to the tail engines.
        fetch_model_info: read ``max_model_len`` from ``/v1/models`` once per endpoint.
        discover_roles: ask unroled endpoints ``/get_metrics_worker_info`` once.
        health_thresholds: when health conditions fire.
        group_by_model: one extra scope per served model (``model:{name}``).
        sink_queue: polls a sink may fall behind before polls are dropped for it.
        boundary_timeout: the longest a synchronous window call waits for its boundary poll
            (None: 2 x timeout + 5 s); the boundary still completes, in order, after it.
        close_timeout: the longest ``stop()`` waits for the sinks to close.
        max_engines_per_endpoint: engines tracked per endpoint (labels that churn past it
            evict the least recently seen; their sums are kept under ``{endpoint}.evicted``).
        evict_after: seconds an engine may stay silent before it is evicted (sums kept).
        isolation: ``"inline"`` (scraping and statistics in this process, off its event
            loop), ``"process"`` (all of it in a supervised child process: the trainer only
            receives finished rows; docs/footprint.md) or ``"auto"`` (``"process"`` from
            :data:`ISOLATION_AUTO_ENDPOINTS` endpoints on).
        rl_probes: ask every endpoint ``/is_paused`` and ``/is_sleeping`` each poll: None
            (default) once a policy version is set or a weight sync entered, True always,
            False never (the ``engine_sleep_state`` gauges are read either way).
    """

    interval: float = 5.0
    timeout: float = 5.0
    max_concurrency: int = 64
    max_body_bytes: int = MAX_BODY_BYTES
    headers: Mapping[str, str] = field(default_factory=dict)
    verify: bool | str = True
    schema: Schema = "prime-rl"
    key_budget: int = DEFAULT_KEY_BUDGET
    fetch_model_info: bool = True
    discover_roles: bool = True
    health_thresholds: HealthThresholds = field(default_factory=HealthThresholds)
    group_by_model: bool = False
    sink_queue: int = 64
    boundary_timeout: float | None = None
    close_timeout: float = 30.0
    max_engines_per_endpoint: int = 512
    evict_after: float = 600.0
    isolation: Isolation = "auto"
    rl_probes: bool | None = None

    def __post_init__(self) -> None:
        if self.isolation not in ("inline", "process", "auto"):
            raise ValueError(f"isolation must be inline, process or auto, not {self.isolation!r}")
        if self.interval <= 0:
            raise ValueError("interval must be positive")
        if self.timeout <= 0:
            raise ValueError("timeout must be positive")

    @property
    def key_options(self) -> KeyOptions:
        return KeyOptions(schema=self.schema, key_budget=self.key_budget)

    @property
    def boundary_wait(self) -> float:
        return self.boundary_timeout if self.boundary_timeout is not None else 2 * self.timeout + 5

    def with_options(self, **options: Any) -> CollectorConfig:
        """A copy with ``options`` changed; None values keep the current setting."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown collector option(s): {sorted(unknown)}")
        changes = {k: v for k, v in options.items() if v is not None}
        if "headers" in changes:
            changes["headers"] = dict(changes["headers"])
        return dataclasses.replace(self, **changes)

    def http_options(self) -> dict[str, Any]:
        """What an :class:`~fleetscope.sources.http.source.HttpSource` takes from this config."""
        return {
            "timeout": self.timeout,
            "max_concurrency": self.max_concurrency,
            "max_body_bytes": self.max_body_bytes,
            "headers": dict(self.headers),
            "verify": self.verify,
            "discover_roles": self.discover_roles,
            "fetch_model_info": self.fetch_model_info,
        }
