"""The real vLLM scenario's names and its record (:class:`RealRun`), filled by the session fixture
in ``conftest.py`` and read by the tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetscope.collector.core import FleetView
    from support.prom import PrometheusServer

# body file name prefix per endpoint
KIND = {"server0": "single", "server1": "dp2"}
# endpoint groups: per-server scopes in fleetscope's keys
GROUP = {"server0": "single", "server1": "dp2"}
WINDOW = "load"
# one poll's row of the table: {engine: (running, waiting, generation tok/s)}
PollRow = dict[str, tuple[float | None, float | None, float | None]]


@dataclass
class RealRun:
    urls: dict[str, str]  # endpoint name -> base URL
    targets: dict[str, str]  # endpoint name -> host:port (Prometheus instance label)
    prom: PrometheusServer  # alive for the whole session
    out_dir: Path
    bodies: dict[tuple[str, str], str] = field(default_factory=dict)  # (endpoint, phase) -> text
    content_types: dict[tuple[str, str], str] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)  # the load generator's JSON
    first_view: FleetView | None = None  # fleetscope's FleetView of the first poll
    views: list[FleetView] = field(default_factory=list)  # every poll's view
    window_keys: dict[str, float] = field(default_factory=dict)
    summary: dict[str, float | str] = field(default_factory=dict)
    t1: float = 0.0  # PromQL evaluation times of the frozen states
    t2: float = 0.0
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    quiet_polls: int = 0  # scrapes taken while waiting for the counters to settle
    load_samples: int = 0  # direct scrapes under load (to pick the "load" bodies)
    # per poll: (seconds since the first poll, {engine: (running, waiting, generation tok/s)})
    poll_table: list[tuple[float, PollRow]] = field(default_factory=list)

    def body(self, endpoint: str, phase: str) -> str:
        return self.bodies[(endpoint, phase)]

    def record(self, view: FleetView) -> None:
        self.views.append(view)
        t0 = self.views[0].result.time
        row: PollRow = {}
        for eid, e in sorted(view.engines.items()):
            gen = view.keys.get(f"inference/{eid}/generation_tokens_total:rate")
            row[eid] = (e.running, e.waiting, None if gen is None else round(gen, 1))
        self.poll_table.append((round(view.result.time - t0, 2), row))

    def table(self) -> str:
        return "\n".join(f"  t={t:6.2f}s {row}" for t, row in self.poll_table)
