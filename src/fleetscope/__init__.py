"""fleetscope: correct fleet statistics for LLM inference engines, from their ``/metrics``.

The public API. Everything here is importable as ``fleetscope.X``; names whose module needs an
optional extra (W&B, TensorBoard, MLflow, Ray) are imported only when first used::

    import fleetscope as fs

    async with fs.Collector(["http://gpu0:8000"], sinks=[fs.JsonlSink("polls.jsonl")]) as c:
        ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module it lives in (imported on first use: some need an optional extra)
_EXPORTS: dict[str, str] = {
    "Collector": "fleetscope.collector.core",
    "CollectorConfig": "fleetscope.fleet.config",
    "WindowHandle": "fleetscope.collector.handles",
    "WindowError": "fleetscope.stats.windows",
    "WeightSyncHandle": "fleetscope.rl.weight_sync",
    "FleetView": "fleetscope.fleet.view",
    "EngineLoad": "fleetscope.fleet.view",
    "EngineId": "fleetscope.identity",
    "Endpoint": "fleetscope.sources.http.source",
    "HttpSource": "fleetscope.sources.http.source",
    "Source": "fleetscope.sources.base",
    "ScrapeResult": "fleetscope.sources.base",
    "PrometheusSource": "fleetscope.sources.prometheus",
    "RaySource": "fleetscope.sources.ray.source",
    "RayIdentity": "fleetscope.sources.ray.source",
    "ShardedCollector": "fleetscope.collector.sharded",
    "ShardedSource": "fleetscope.collector.sharded",
    "Sink": "fleetscope.sinks.base",
    "JsonlSink": "fleetscope.sinks.jsonl",
    "read_jsonl": "fleetscope.sinks.jsonl",
    "TerminalSink": "fleetscope.sinks.terminal",
    "WandbSink": "fleetscope.sinks.wandb",
    "TensorBoardSink": "fleetscope.sinks.tensorboard",
    "MlflowSink": "fleetscope.sinks.mlflow",
    "GrafanaAnnotator": "fleetscope.sinks.grafana",
    "stop_on_signals": "fleetscope.collector.signals",
    "HealthThresholds": "fleetscope.health",
    "HealthEvent": "fleetscope.health",
    "parse": "fleetscope.exposition",
    "Parser": "fleetscope.exposition",
    "Exposition": "fleetscope.exposition",
    "ExpositionError": "fleetscope.exposition",
}

__all__ = [
    "Collector",
    "CollectorConfig",
    "Endpoint",
    "EngineId",
    "EngineLoad",
    "Exposition",
    "ExpositionError",
    "FleetView",
    "GrafanaAnnotator",
    "HealthEvent",
    "HealthThresholds",
    "HttpSource",
    "JsonlSink",
    "MlflowSink",
    "Parser",
    "PrometheusSource",
    "RayIdentity",
    "RaySource",
    "ScrapeResult",
    "ShardedCollector",
    "ShardedSource",
    "Sink",
    "Source",
    "TensorBoardSink",
    "TerminalSink",
    "WandbSink",
    "WeightSyncHandle",
    "WindowError",
    "WindowHandle",
    "__version__",
    "parse",
    "read_jsonl",
    "stop_on_signals",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleetscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from fleetscope.collector.core import Collector
    from fleetscope.collector.handles import WindowHandle
    from fleetscope.collector.sharded import ShardedCollector, ShardedSource
    from fleetscope.collector.signals import stop_on_signals
    from fleetscope.exposition import Exposition, ExpositionError, Parser, parse
    from fleetscope.fleet.config import CollectorConfig
    from fleetscope.fleet.view import EngineLoad, FleetView
    from fleetscope.health import HealthEvent, HealthThresholds
    from fleetscope.identity import EngineId
    from fleetscope.rl.weight_sync import WeightSyncHandle
    from fleetscope.sinks.base import Sink
    from fleetscope.sinks.grafana import GrafanaAnnotator
    from fleetscope.sinks.jsonl import JsonlSink, read_jsonl
    from fleetscope.sinks.mlflow import MlflowSink
    from fleetscope.sinks.tensorboard import TensorBoardSink
    from fleetscope.sinks.terminal import TerminalSink
    from fleetscope.sinks.wandb import WandbSink
    from fleetscope.sources.base import ScrapeResult, Source
    from fleetscope.sources.http.source import Endpoint, HttpSource
    from fleetscope.sources.prometheus import PrometheusSource
    from fleetscope.sources.ray.source import RayIdentity, RaySource
    from fleetscope.stats.windows import WindowError
