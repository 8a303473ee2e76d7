"""Engines that run inside this process (vLLM's ``LLM(...)`` in the trainer, a colocated
engine): its prometheus_client registry as a source, read through ``collect()``.

No HTTP server and no text rendering of the registry: each poll the collector's worker thread
calls ``registry.collect()`` (the registry's own locks make that safe while the engine records
from another thread), keeps the ``vllm:`` and ``sglang:`` families (and
``process_start_time_seconds``), and hands them to the same parser as a scrape, so snapshots,
keys, windows and the run summary are those of the HTTP source for the same engine state.
Several engines in one registry (vLLM's ``engine`` label) stay separate engines.

Use it from a synchronous trainer with ``Collector.start_background()``: the collector polls in
its own thread, the registry is read in its worker thread while ``llm.generate()`` runs::

    llm = LLM(model, disable_log_stats=False)      # vLLM records its metrics only with stats on
    collector = fs.Collector(source=fs.InProcessSource(), interval=5.0, sinks=[...])
    collector.start_background()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from fleetscope.identity import Role
from fleetscope.sources.families import DEFAULT_KEEP, MetricFamily
from fleetscope.sources.local import LocalSource

if TYPE_CHECKING:
    from prometheus_client.registry import Collector as PromCollector

__all__ = ["InProcessSource"]


class InProcessSource(LocalSource):
    """This process's prometheus_client registry (default ``prometheus_client.REGISTRY``).

    Args:
        registry: any object with prometheus_client's ``collect()`` (a ``CollectorRegistry``).
        name: the endpoint's name in keys (``server0``, as the HTTP source names its first
            endpoint: the same keys as watching that engine over HTTP).
        role: ``prefill`` / ``decode`` for the endpoint's engines (SGLang bodies say it too).
        groups: user groups (scopes) the endpoint belongs to.
        keep: family-name prefixes read (None: every family of the registry).
    """

    def __init__(
        self,
        registry: PromCollector | None = None,
        *,
        name: str = "server0",
        role: Role | None = None,
        groups: Sequence[str] = (),
        keep: Sequence[str] | None = DEFAULT_KEEP,
        warn_interval: float = 60.0,
    ) -> None:
        super().__init__(
            name=name,
            role=role,
            groups=groups,
            keep=keep,
            warn_interval=warn_interval,
            thread_name="fleetscope-inprocess",
        )
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        self.registry = registry

    def collect(self) -> Iterable[MetricFamily]:
        return self.registry.collect()

    def where(self) -> str:
        return "this process's prometheus_client registry"
