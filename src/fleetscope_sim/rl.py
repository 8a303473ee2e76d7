"""vLLM 0.32's RL endpoints on a simulated API server (``VLLM_SERVER_DEV_MODE=1``).

What ``tests/data/real-vllm-rl/README.md`` recorded on real servers (and the installed wheel's
routers say), reduced to what fleetscope reads:

* a weight version per endpoint (``"default"`` at start; ``GET /weight_info``, ``POST
  /update_weight_version {"new_version": str}``, ``/finish_weight_update {"weight_version"}``);
* ``POST /pause`` (``mode``, ``clear_cache`` validated; always a keep-pause here: running
  requests freeze, nothing is generated until ``/resume``), ``POST /resume``, ``GET
  /is_paused``, ``GET /is_sleeping`` (true while paused or asleep, as vLLM's);
* sleep mode: ``POST /sleep?level=&mode=``, ``POST /wake_up?tags=``, ``POST
  /release_kv_cache_memory`` (:mod:`~fleetscope_sim.rl_sleep`), which drive
  ``vllm:engine_sleep_state`` per engine;
* the weight-transfer calls (:mod:`~fleetscope_sim.rl_transfer`);
* the timed handlers' lazily created, engine-less families
  ``vllm:rl_weight_update_operation_duration_seconds{operation}``,
  ``vllm:sleep_mode_operation_duration_seconds{operation}`` and their ``_operations_in_flight``
  gauges (:mod:`~fleetscope_sim.rl_metrics`). A timed call observes
  ``SimRL.operation_seconds[operation]`` (simulated time: deterministic); ``SimRL.hold(op)``
  keeps the next such call in its handler, in flight, until released.

``dev_mode = False`` makes every route 404; the sleep-mode and weight-transfer routes are
vLLM's only (404 on SGLang endpoints).

Ground truth: :attr:`SimRL.version_history` (every version set, with its simulated Unix time),
:attr:`SimRL.calls` (every RL call: request, answer, operation, observed seconds; kept when the
endpoint records observations) and :attr:`SimRL.call_counts` (always), the timed families'
observations in ``endpoint.truth`` (never reset: :meth:`SimRL.truth`),
``SimRL.transfer.completed``, and each engine's ``sleep_state`` / ``truth.gauges``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import rl_sleep, rl_transfer
from .hosts import RLHost
from .ledger import HistogramCounts
from .rl_http import Answer, Request, Timed, bool_param, embedded, pause_mode, validation_error
from .rl_metrics import (
    DEFAULT_OPERATION_SECONDS,
    FAMILIES_OF,
    OPERATION_BUCKETS,
    WEIGHT_UPDATE,
    OperationMetrics,
)

RL_OPERATION_FAMILY = WEIGHT_UPDATE.name
RL_OPERATION_HELP = WEIGHT_UPDATE.help
RL_OPERATION_BUCKETS = OPERATION_BUCKETS
RL_IN_FLIGHT_FAMILY = WEIGHT_UPDATE.in_flight
RL_IN_FLIGHT_HELP = WEIGHT_UPDATE.in_flight_help
RL_OPERATIONS = WEIGHT_UPDATE.operations
INITIAL_VERSION = "default"

Handler = Callable[["SimRL", Request], "Answer | Timed"]


@dataclass
class SimCall:
    """One call of an RL route, as the ledger keeps it (``status`` None while in flight)."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    sim_time: float
    status: int | None = None
    response: Any = None
    operation: str | None = None
    seconds: float | None = None


class Hold:
    """Keeps the next call of ``operation`` in its handler until :meth:`release`.

    ``entered`` is set once that call is in flight (its ``_operations_in_flight`` child is up);
    its effect and its observation happen when it is released (what ``Timed.begin`` changes,
    at once). Released before a call took it, it is cancelled.
    """

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.entered = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()


class PendingCall:
    """A timed call held in its handler (the HTTP server awaits ``released``, then
    ``finish()``)."""

    def __init__(
        self, rl: SimRL, call: SimCall, timed: Timed, metrics: OperationMetrics, hold: Hold
    ):
        self._rl, self._call, self._timed, self._metrics = rl, call, timed, metrics
        self.hold = hold

    @property
    def released(self) -> bool:
        return self.hold.released.is_set()

    def finish(self) -> Answer:
        with self._rl.endpoint._lock:
            return self._rl._finish(self._call, self._timed, self._metrics)


def _pause(rl: SimRL, req: Request) -> Answer:
    error = pause_mode(req) or bool_param(req, "clear_cache")
    if error is not None:
        return error
    rl.pause()
    return 200, {"status": "paused"}


def _resume(rl: SimRL, req: Request) -> Answer:
    rl.resume()
    return 200, {"status": "resumed"}


def _update_weight_version(rl: SimRL, req: Request) -> Answer:
    error, version = embedded(req, "new_version", required=True)
    if error is not None:
        return error
    if not isinstance(version, str):
        msg = "Input should be a valid string"
        return validation_error("body.new_version", "string_type", msg, version)
    rl.set_version(version)
    return 200, {"success": True, "new_version": version}


#: path -> (method, handler, vLLM only)
ROUTES: dict[str, tuple[str, Handler, bool]] = {
    "/weight_info": ("GET", lambda rl, req: (200, {"weight_version": rl.version}), False),
    "/update_weight_version": ("POST", _update_weight_version, False),
    "/pause": ("POST", _pause, False),
    "/resume": ("POST", _resume, False),
    "/is_paused": ("GET", lambda rl, req: (200, {"is_paused": rl.paused}), False),
    "/is_sleeping": ("GET", rl_sleep.route_is_sleeping, False),
    "/sleep": ("POST", rl_sleep.route_sleep, True),
    "/wake_up": ("POST", rl_sleep.route_wake_up, True),
    "/release_kv_cache_memory": ("POST", rl_sleep.route_release_kv_cache_memory, True),
    "/init_weight_transfer_engine": ("POST", rl_transfer.route_init, True),
    "/shutdown_weight_transfer_engine": ("POST", rl_transfer.route_shutdown, True),
    "/start_weight_update": ("POST", rl_transfer.route_start, True),
    "/start_draft_weight_update": ("POST", rl_transfer.route_start_draft, True),
    "/update_weights": ("POST", rl_transfer.route_update, True),
    "/finish_weight_update": ("POST", rl_transfer.route_finish, True),
}
_NOT_FOUND: Answer = (404, {"detail": "Not Found"})


class SimRL:
    """The RL state of one simulated API server (all its engines: DP broadcasts)."""

    def __init__(self, endpoint: RLHost) -> None:
        self.endpoint = endpoint
        self.dev_mode = True  # False: every RL route answers 404, as without the env var
        #: a CPU build (as recorded): release_kv_cache_memory fails after its checks, an ipc
        #: chunk with tensors fails; False: what a GPU does
        self.cpu = False
        self.version: str = INITIAL_VERSION
        self.version_history: list[tuple[str, float]] = []
        self.transfer = rl_transfer.WeightTransfer()
        #: operation -> seconds its timed handler observes
        self.operation_seconds: dict[str, float] = dict(DEFAULT_OPERATION_SECONDS)
        #: family name -> the server process's metrics object, in creation order
        self.metrics: dict[str, OperationMetrics] = {}
        self.calls: list[SimCall] = []
        #: (method, path, status) -> calls answered (never reset)
        self.call_counts: dict[tuple[str, str, int], int] = {}
        self._holds: dict[str, list[Hold]] = {}

    @property
    def paused(self) -> bool:
        """Whether the scheduler is paused (``/pause``, ``/sleep``): ``GET /is_paused``."""
        return any(e.scheduler_paused for e in self.endpoint.engines)

    # -- state changes (callers hold the endpoint's lock) ---------------------------------------
    def set_version(self, version: str) -> None:
        self.version = version
        self.version_history.append((version, self.endpoint._wall_now()))

    def pause(self) -> None:
        for e in self.endpoint.engines:
            e.scheduler_paused = True

    def resume(self) -> None:
        for e in self.endpoint.engines:
            e.scheduler_paused = False

    def _metrics_for(self, operation: str) -> OperationMetrics:
        spec = FAMILIES_OF.get(operation)
        if spec is None:
            raise ValueError(f"unknown operation {operation!r}")
        metrics = self.metrics.get(spec.name)
        if metrics is None:
            metrics = self.metrics[spec.name] = OperationMetrics(spec, self.endpoint)
        return metrics

    def observe_operation(self, operation: str, seconds: float) -> None:
        """One timed call of ``operation`` without HTTP (in flight, then observed)."""
        metrics = self._metrics_for(operation)
        metrics.begin(operation)
        metrics.end(operation, seconds)

    def set_in_flight(self, operation: str, n: float) -> None:
        """``..._operations_in_flight{operation}`` (a handler awaiting its call)."""
        self._metrics_for(operation).in_flight[operation] = float(n)

    def reset(self) -> None:
        """A restarted server: version ``default``, no RL family, no transfer session."""
        self.version = INITIAL_VERSION
        self.metrics = {}
        self.transfer.restart()

    def truth(self, operation: str) -> HistogramCounts | None:
        """Every observation of ``operation`` over the server's life (None: never called)."""
        return self.endpoint.truth.histogram(FAMILIES_OF[operation].name, operation)

    def hold(self, operation: str) -> Hold:
        """Keep the next timed call of ``operation`` in flight until ``.release()``."""
        if operation not in FAMILIES_OF:
            raise ValueError(f"unknown operation {operation!r}")
        hold = Hold(operation)
        with self.endpoint._lock:
            self._holds.setdefault(operation, []).append(hold)
        return hold

    # -- HTTP ----------------------------------------------------------------------------------
    def answer(
        self, method: str, path: str, body: bytes = b"", query: str = ""
    ) -> Answer | PendingCall | None:
        """The answer to an RL route (a :class:`PendingCall` if held), None when ``path`` is
        not one."""
        route = ROUTES.get(path)
        if route is None:
            return None
        want, handler, vllm_only = route
        ep = self.endpoint
        if not self.dev_mode or (vllm_only and ep.engine_kind != "vllm"):
            return _NOT_FOUND
        if (method if method != "HEAD" else "GET") != want:
            return 405, {"detail": "Method Not Allowed"}
        req = Request.parse(method, path, body, query)
        with ep._lock:
            call = SimCall(method, path, req.query, _json_or_text(body), ep._last_step_sim)
            if ep.record_observations:
                self.calls.append(call)
            result = handler(self, req)
            if not isinstance(result, Timed):
                ep._touch()
                return self._answered(call, result)
            metrics = self._metrics_for(result.operation)
            metrics.begin(result.operation)
            call.operation = result.operation
            if result.begin is not None:
                result.begin()
            ep._touch()
            holds = self._holds.get(result.operation, [])
            while holds:
                hold = holds.pop(0)
                if not hold.released.is_set():  # released before any call took it: cancelled
                    hold.entered.set()
                    return PendingCall(self, call, result, metrics, hold)
            return self._finish(call, result, metrics)

    def call(self, method: str, path: str, body: Any = None, query: str = "") -> Answer:
        """An RL route called without HTTP (waits for a hold's release): ``(status, JSON)``."""
        raw = b"" if body is None else json.dumps(body).encode()
        result = self.answer(method, path, raw, query)
        if result is None:
            raise KeyError(path)
        if isinstance(result, PendingCall):
            result.hold.released.wait()
            return result.finish()
        return result

    def _finish(self, call: SimCall, timed: Timed, metrics: OperationMetrics) -> Answer:
        seconds = self.operation_seconds.get(timed.operation, 0.0)
        try:
            result = timed.run()
        finally:  # vLLM's record(): failed calls are observed too
            metrics.end(timed.operation, seconds)
            self.endpoint._touch()
        call.seconds = seconds
        return self._answered(call, result)

    def _answered(self, call: SimCall, result: Answer) -> Answer:
        call.status, call.response = result
        key = (call.method, call.path, result[0])
        self.call_counts[key] = self.call_counts.get(key, 0) + 1
        return result

    # -- exposition ----------------------------------------------------------------------------
    def families(self, single: bool) -> list[tuple[str, str, str, list[Any]]]:
        """The timed handlers' families (none before the first timed call)."""
        out: list[tuple[str, str, str, list[Any]]] = []
        for metrics in self.metrics.values():
            out.extend(metrics.families(single))
        return out


def _json_or_text(body: bytes) -> Any:
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
