"""The timed RL handlers' families of vLLM 0.32, on a simulated API server.

vLLM times its weight-transfer and sleep-mode HTTP handlers with two metrics objects
(``entrypoints/rl/online/metrics.py`` ``WeightOperationMetrics``,
``entrypoints/serve/dev/sleep/metrics.py`` ``SleepModeOperationMetrics``), each a histogram
``..._operation_duration_seconds{operation}`` and a ``livesum`` gauge
``..._operations_in_flight{operation}``; neither has an ``engine`` (or ``model_name``) label.
``record(op)`` raises the gauge's child (created then) while the handler awaits the engine and,
in a ``finally``, lowers it and observes the histogram's child (created then): failed calls
(HTTP 500) are observed too, validation failures (400) never reach the handler. The objects
are created at the first timed call of their kind, so both families are absent until then,
and a histogram whose only call is still in flight has no child yet.

:class:`OperationMetrics` is one such object in one simulated server process: replaced on a
restart. Every observation also goes to the endpoint's ``truth`` ledger (never reset), keyed
``(operation,)``: ``endpoint.truth.histogram(WEIGHT_UPDATE.name, "update")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .exposition_rows import histogram_rows
from .hosts import RLHost
from .ledger import HistogramCounts

#: vLLM's buckets of both histograms (``+Inf`` implied)
OPERATION_BUCKETS: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class OperationFamilies:
    """Names, help texts and operations of one metrics object, exactly as vLLM 0.32's."""

    name: str
    help: str
    in_flight: str
    in_flight_help: str
    operations: tuple[str, ...]


WEIGHT_UPDATE = OperationFamilies(
    "vllm:rl_weight_update_operation_duration_seconds",
    "Duration of one weight-transfer operation.",
    "vllm:rl_weight_update_operations_in_flight",
    "Weight-transfer operations currently awaited.",
    ("init", "shutdown", "start", "start_draft", "update", "finish"),
)
SLEEP_MODE = OperationFamilies(
    "vllm:sleep_mode_operation_duration_seconds",
    "Duration of one sleep-mode operation.",
    "vllm:sleep_mode_operations_in_flight",
    "Sleep-mode operations currently awaited.",
    ("sleep", "release_kv_cache_memory", "wake"),
)
FAMILIES_OF = {op: spec for spec in (WEIGHT_UPDATE, SLEEP_MODE) for op in spec.operations}

#: what a simulated handler observes when nothing else is set (``SimRL.operation_seconds``):
#: about what the CPU recordings took
DEFAULT_OPERATION_SECONDS: dict[str, float] = {
    "init": 0.012,
    "shutdown": 0.016,
    "start": 0.004,
    "start_draft": 0.02,
    "update": 0.5,
    "finish": 0.003,
    "sleep": 0.021,
    "release_kv_cache_memory": 0.017,
    "wake": 0.009,
}


class OperationMetrics:
    """One metrics object of a simulated server process (created at its first timed call)."""

    def __init__(self, spec: OperationFamilies, endpoint: RLHost) -> None:
        self.spec = spec
        self._endpoint = endpoint
        #: operation -> calls being handled (children in creation order, as prometheus_client)
        self.in_flight: dict[str, float] = {}
        #: operation -> exported histogram (created at its first observation)
        self.histograms: dict[str, HistogramCounts] = {}
        self.created: dict[str, float] = {}

    def _check(self, operation: str) -> None:
        if operation not in self.spec.operations:
            raise ValueError(f"operation must be one of {self.spec.operations}: {operation!r}")

    def begin(self, operation: str) -> None:
        """A handler starts awaiting the engine: ``in_flight{operation}`` + 1."""
        self._check(operation)
        self.in_flight[operation] = self.in_flight.get(operation, 0.0) + 1.0

    def end(self, operation: str, seconds: float) -> None:
        """The handler's ``finally``: ``in_flight`` - 1, then one observation of ``seconds``."""
        self.in_flight[operation] = self.in_flight.get(operation, 1.0) - 1.0
        self.observe(operation, seconds)

    def observe(self, operation: str, seconds: float) -> None:
        """One observation (exported and ground truth)."""
        self._check(operation)
        ep = self._endpoint
        hist = self.histograms.get(operation)
        if hist is None:
            hist = self.histograms[operation] = HistogramCounts(OPERATION_BUCKETS)
            self.created[operation] = ep._wall_now()
        hist.observe(seconds)
        ep.truth.observe(self.spec.name, OPERATION_BUCKETS, seconds, key=(operation,))

    def families(self, single: bool) -> list[tuple[str, str, str, list[Any]]]:
        """The histogram and the in-flight gauge, as (base name, type, help, rows).

        Single-process bodies list children in creation order and show a family without
        children (its ``HELP``/``TYPE`` only); multiprocess bodies only families with samples.
        """
        spec = self.spec
        hist_rows: list[Any] = []
        ops = list(self.histograms) if single else sorted(self.histograms)
        for op in ops:
            created = self.created[op] if single else None
            labels = (("operation", op),)
            histogram_rows(hist_rows, spec.name, labels, self.histograms[op], created, single)
        flights = list(self.in_flight) if single else sorted(self.in_flight)
        gauge_rows = [(spec.in_flight, (("operation", op),), self.in_flight[op]) for op in flights]
        out = [
            (spec.name, "histogram", spec.help, hist_rows),
            (spec.in_flight, "gauge", spec.in_flight_help, gauge_rows),
        ]
        return [f for f in out if single or f[3]]
