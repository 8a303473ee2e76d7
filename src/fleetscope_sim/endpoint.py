"""One simulated vLLM API server (an *endpoint*): its engines, its state, its own series.

``SimEndpoint`` is assembled from one module per concern: its ``/metrics`` exposition
(:mod:`~fleetscope_sim.endpoint_exposition`, registry and the two exposition modes), its
HTTP answers (:mod:`~fleetscope_sim.endpoint_http`, ``/metrics`` with faults applied,
``/v1/models`` ...) and its fault injection (:mod:`~fleetscope_sim.endpoint_faults`). This
module holds the endpoint's state and stepping (on a :class:`~fleetscope_sim.clock.SimClock`),
and the API server's own series (``admission_rejections_total``, ``http_*``) with their
never-reset ground truth. Its engines and its RL state see it through the Protocols of
:mod:`~fleetscope_sim.hosts`.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from .clock import ProcessState, SimClock
from .endpoint_exposition import EndpointCollector, EndpointExposition, Mode
from .endpoint_faults import EndpointFaultInjection, EndpointFaults
from .endpoint_http import CONTENT_TYPE_LATEST, GARBAGE_BODY, EndpointHTTPAnswers, MetricsResponse
from .engine import LoadProfile, Role, SimEngine
from .exposition_rows import LabelPairs
from .ledger import Ledger, SeriesKey, Truth
from .rl import SimRL
from .vllm_families import FAMILIES_BY_NAME, HTTP_FAMILIES, HTTP_HANDLERS

__all__ = [
    "CONTENT_TYPE_LATEST",
    "GARBAGE_BODY",
    "VLLM_VERSION",
    "EndpointFaults",
    "MetricsResponse",
    "Mode",
    "SimClock",
    "SimEndpoint",
]

#: what a simulated vLLM server answers on ``GET /version``
VLLM_VERSION = "0.32.0"


class SimEndpoint(EndpointExposition, EndpointHTTPAnswers, EndpointFaultInjection):
    """One simulated vLLM API server with ``dp`` engine cores behind it.

    Create endpoints with ``SimFleet.add_endpoint`` (shared clock and lock) or standalone (own
    clock; then call ``endpoint.step(dt)``).

    Attributes:
        name: display name (``server0``, ``prefill0``, ``decode1``...).
        role: ``None``, ``"prefill"`` or ``"decode"`` (answered by ``/get_metrics_worker_info``).
        mode: ``"single"`` or ``"multiprocess"`` exposition (default: multiprocess iff dp > 1,
            as vLLM does).
        model_name / max_model_len: served model (``/v1/models``; token-histogram buckets).
        engines: the ``SimEngine`` cores (``engine="0"``, ``"1"``...).
        registry: the endpoint's ``CollectorRegistry``.
        exported / truth: the API server's own families (``admission_rejections_total``,
            ``http_*``, process counters): what is shown, and the never-reset ground truth.
        faults: current ``EndpointFaults``.
        worker_id: 56-hex id answered by ``/get_metrics_worker_info``.
        restarts: number of whole-server restarts.
        engine_kind / server_version: ``"vllm"`` and what ``GET /version`` answers.
    """

    engine_kind = "vllm"
    server_version = VLLM_VERSION
    engine_class: type[SimEngine] = SimEngine

    def __init__(
        self,
        name: str = "server0",
        *,
        role: Role = None,
        dp: int = 1,
        mode: Mode | None = None,
        model_name: str = "tinymodel",
        max_model_len: int = 512,
        load: LoadProfile | None = None,
        seed: int = 0,
        record_observations: bool = True,
        clock: SimClock | None = None,
        lock: threading.RLock | None = None,
        worker_id: str | None = None,
    ) -> None:
        if role not in (None, "prefill", "decode"):
            raise ValueError(f"role must be None, 'prefill' or 'decode', not {role!r}")
        if dp < 1:
            raise ValueError("dp must be >= 1")
        if mode is None:
            mode = "multiprocess" if dp > 1 else "single"
        if mode not in ("single", "multiprocess"):
            raise ValueError(f"mode must be 'single' or 'multiprocess', not {mode!r}")
        if max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        self.name = name
        self.role: Role = role
        self.mode: Mode = mode
        self.model_name = model_name
        self.max_model_len = int(max_model_len)
        self.load = load if load is not None else LoadProfile()
        self.seed = seed
        self.record_observations = record_observations
        self._owns_clock = clock is None
        self.clock = clock if clock is not None else SimClock()
        self._lock = lock if lock is not None else threading.RLock()
        self.worker_id = worker_id or hashlib.sha224(f"{seed}/{name}".encode()).hexdigest()
        self.faults = EndpointFaults()
        self.restarts = 0
        # called after a whole-server restart (the HTTP server drops the old process' connections)
        self.restart_hooks: list[Callable[[], None]] = []
        self._version = 0
        #: serve ``render_fast()`` (identical bytes, cheaper) instead of ``render()``
        self.fast_render = True
        self._cache: tuple[int, bytes] | None = None
        self._label_strings: dict[LabelPairs, str] = {}
        self._child_label_cache: dict[tuple[str, str | None, SeriesKey], LabelPairs] = {}
        self._headers: dict[str, tuple[str, str]] = {}
        self._huge_cache: tuple[int, float, bytes] | None = None
        self.truth = Truth(record_observations)
        self._last_step_sim = self.clock.sim_time
        self._reset_server_state(self.clock.wall())
        self.engines: list[SimEngine] = [
            self.engine_class(self, i, self.load, seed, self._engine_start(i), record_observations)
            for i in range(dp)
        ]
        #: the RL endpoints (/weight_info, /pause, /sleep, weight transfer ...): see rl.py
        self.rl = SimRL(self)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EndpointCollector(self))

    # -- state --------------------------------------------------------------------------------
    def _reset_server_state(self, start_wall: float) -> None:
        # process_start_time_seconds has 10 ms resolution, as prometheus_client's.
        start_wall = math.floor(start_wall * 100 + 1e-6) / 100
        self._process = ProcessState(start_wall=start_wall, start_sim=self._last_step_sim)
        self.exported = Ledger(self.record_observations)
        self.created: dict[tuple[str, SeriesKey], float] = {}
        spec = FAMILIES_BY_NAME["vllm:admission_rejections_total"]
        for i, reason in enumerate(spec.label_values):
            self.exported.ensure_counter(spec.name, (reason,))
            self.truth.ensure_counter(spec.name, (reason,))
            self.created[(spec.name, (reason,))] = start_wall + 0.002 + 1e-6 * i
        highr = "http_request_duration_highr_seconds"
        bounds = _http_bounds(highr)
        self.exported.ensure_histogram(highr, bounds)
        self.truth.ensure_histogram(highr, bounds)
        self.created[(highr, ())] = start_wall + 0.003

    def _engine_start(self, index: int) -> float:
        """Engine cores come up a few ms after their API server process."""
        return self._process.start_wall + 1e-3 * (index + 1)

    def _touch(self) -> None:
        self._version += 1

    def step(self, dt: float) -> None:
        """Advance a standalone endpoint by ``dt`` simulated seconds (fleets use
        ``SimFleet.step``)."""
        if not self._owns_clock:
            raise RuntimeError(f"{self.name} belongs to a fleet: call SimFleet.step()")
        with self._lock:
            self.clock.advance(dt)
            self._step_to(self.clock.sim_time)

    def _step_to(self, t_end: float) -> None:
        dt = max(0.0, t_end - self._last_step_sim)
        self._last_step_sim = t_end
        syncing = "syncing" if self.rl.transfer.active else None  # the truth's phase override
        for engine in self.engines:
            engine.truth.phases.override = syncing
            engine.step(t_end)
        busy = sum(e.num_running for e in self.engines)
        self._process.cpu_seconds += dt * (0.05 + 0.9 * min(1.0, busy / 8.0))
        self._touch()

    # -- recording (called by engines) --------------------------------------------------------
    def _wall_now(self) -> float:
        """Simulated unix time this endpoint has been stepped to."""
        return self.clock.wall_start + self._last_step_sim

    def _add(self, family: str, amount: float, key: SeriesKey) -> None:
        if key not in self.exported.counters.get(family, ()):
            self.created[(family, key)] = self._wall_now()
        self.exported.add(family, amount, key)
        self.truth.add(family, amount, key)

    def _record_rejection(self, reason: str) -> None:
        self._add("vllm:admission_rejections_total", 1, (reason,))

    def _record_http(self, handler: int, prompt_tokens: int, gen_tokens: int, e2e: float) -> None:
        path = HTTP_HANDLERS[handler]
        wall = self._wall_now()
        duration = e2e + 0.002
        self._add("http_requests_total", 1, (path, "POST", "2xx"))
        for family, value in (
            ("http_request_size_bytes", 120.0 + 4.0 * prompt_tokens),
            ("http_response_size_bytes", 250.0 + 4.0 * gen_tokens),
        ):
            if (path,) not in self.exported.summaries.get(family, ()):
                self.created[(family, (path,))] = wall
            self.exported.summary_observe(family, value, (path,))
            self.truth.summary_observe(family, value, (path,))
        for family, key in (
            ("http_request_duration_highr_seconds", ()),
            ("http_request_duration_seconds", (path, "POST")),
        ):
            if key not in self.exported.histograms.get(family, ()):
                self.created[(family, key)] = wall
            bounds = _http_bounds(family)
            self.exported.observe(family, bounds, duration, key=key)
            self.truth.observe(family, bounds, duration, key=key)

    # -- convenience -----------------------------------------------------------------------------
    def truth_total(self, family: str, *key: str) -> float:
        """Ground-truth total of a counter over this endpoint's engines (or its own series)."""
        if family in self.truth.counters:
            return self.truth.counter(family, *key)
        return sum(e.truth.counter(family, *key) for e in self.engines)

    def __repr__(self) -> str:
        return (
            f"SimEndpoint({self.name!r}, role={self.role!r}, dp={len(self.engines)}, "
            f"mode={self.mode!r})"
        )


def _http_bounds(family: str) -> tuple[float, ...]:
    for spec in HTTP_FAMILIES:
        if spec.name == family:
            assert isinstance(spec.buckets, tuple)
            return spec.buckets
    raise KeyError(family)
