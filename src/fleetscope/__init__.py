"""fleetscope: correct fleet statistics for LLM inference engines, from their ``/metrics``.

The public API: every name in ``__all__`` is importable as ``fleetscope.X``. The names whose
module needs an optional extra (W&B, TensorBoard, MLflow, Ray) are imported when first used
(``_LAZY``), so ``import fleetscope`` never imports the extras::

    import fleetscope as fs

    async with fs.Collector(["http://gpu0:8000"], sinks=[fs.JsonlSink("polls.jsonl")]) as c:
        ...
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING, Any

from fleetscope.collector.core import Collector
from fleetscope.collector.handles import WindowHandle
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
from fleetscope.sinks.terminal import TerminalSink
from fleetscope.sources.base import ScrapeResult, Source
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.sources.inprocess import InProcessSource
from fleetscope.sources.multiproc import MultiprocessSource
from fleetscope.sources.prometheus import PrometheusSource
from fleetscope.stats.windows import WindowError

# name -> its module, for the names whose use needs an optional extra: imported on first use
_LAZY: dict[str, str] = {
    "WandbSink": "fleetscope.sinks.wandb",  # wandb
    "TensorBoardSink": "fleetscope.sinks.tensorboard",  # tensorboard
    "MlflowSink": "fleetscope.sinks.mlflow",  # mlflow
    "RaySource": "fleetscope.sources.ray.source",  # ray
    "RayIdentity": "fleetscope.sources.ray.source",  # ray
    "ShardedCollector": "fleetscope.collector.sharded",  # ray
    "ShardedSource": "fleetscope.collector.sharded",  # ray
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
    "InProcessSource",
    "JsonlSink",
    "MlflowSink",
    "MultiprocessSource",
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
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fleetscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from fleetscope.collector.sharded import ShardedCollector, ShardedSource
    from fleetscope.sinks.mlflow import MlflowSink
    from fleetscope.sinks.tensorboard import TensorBoardSink
    from fleetscope.sinks.wandb import WandbSink
    from fleetscope.sources.ray.source import RayIdentity, RaySource
