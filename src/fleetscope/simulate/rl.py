"""vLLM 0.32's RL endpoints on a simulated API server (``VLLM_SERVER_DEV_MODE=1``).

What ``tests/data/real-vllm-rl/README.md`` recorded on real servers, reduced to what fleetscope
reads: a weight version per endpoint (``"default"`` at start; ``GET /weight_info``, ``POST
/update_weight_version {"new_version": str}``), ``/pause`` / ``/resume`` / ``/is_paused`` /
``/is_sleeping`` (a keep-pause: running requests freeze, nothing is generated until
``/resume``; both say true while an engine sleeps, as vLLM's do), and the lazily created,
engine-less histogram ``vllm:rl_weight_update_operation_duration_seconds{operation}``
(vLLM's buckets), observed by :meth:`SimRL.observe_operation` when a weight update is
simulated. Ground truth: :attr:`SimRL.version_history` (every version set, with its simulated
Unix time) and the histogram itself (never reset while the process lives).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .ledger import HistogramCounts

if TYPE_CHECKING:
    from .endpoint import SimEndpoint

RL_OPERATION_FAMILY = "vllm:rl_weight_update_operation_duration_seconds"
RL_OPERATION_HELP = "Duration of one RL weight-update operation."
RL_OPERATION_BUCKETS: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
RL_IN_FLIGHT_FAMILY = "vllm:rl_weight_update_operations_in_flight"
RL_IN_FLIGHT_HELP = "RL weight-update operations in flight."
RL_OPERATIONS = ("init", "shutdown", "start", "start_draft", "update", "finish")
INITIAL_VERSION = "default"

Answer = tuple[int, dict[str, Any]]


class SimRL:
    """The RL state of one simulated API server (all its engines: DP broadcasts)."""

    def __init__(self, endpoint: SimEndpoint) -> None:
        self._endpoint = endpoint
        self.dev_mode = True  # False: every RL route answers 404, as without the env var
        self.version = INITIAL_VERSION
        self.version_history: list[tuple[str, float]] = []
        self.paused = False
        # operation -> histogram; absent until the first observation (created lazily)
        self.operations: dict[str, HistogramCounts] = {}
        self.created: dict[str, float] = {}
        # operation -> operations in flight (a livesum gauge, created with its histogram)
        self.in_flight: dict[str, float] = {}

    # -- state changes (callers hold the endpoint's lock) ---------------------------------------
    def set_version(self, version: str) -> None:
        self.version = version
        self.version_history.append((version, self._endpoint._wall_now()))

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            for e in self._endpoint.engines:
                e.stall(True)

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            for e in self._endpoint.engines:
                e.stall(False)

    def observe_operation(self, operation: str, seconds: float) -> None:
        if operation not in RL_OPERATIONS:
            raise ValueError(f"operation must be one of {RL_OPERATIONS}, not {operation!r}")
        hist = self.operations.get(operation)
        if hist is None:
            hist = self.operations[operation] = HistogramCounts(RL_OPERATION_BUCKETS)
            self.created[operation] = self._endpoint._wall_now()
        hist.observe(seconds)
        self.in_flight.setdefault(operation, 0.0)

    def set_in_flight(self, operation: str, n: float) -> None:
        """``rl_weight_update_operations_in_flight{operation}`` (a handler awaiting its call)."""
        self.in_flight[operation] = float(n)

    def reset(self) -> None:
        """A restarted server: version ``default``, unpaused, no RL family."""
        self.version = INITIAL_VERSION
        self.paused = False
        self.operations = {}
        self.created = {}
        self.in_flight = {}

    # -- HTTP ----------------------------------------------------------------------------------
    def answer(self, method: str, path: str, body: bytes) -> Answer | None:
        """The answer to an RL route, or None when ``path`` is not one."""
        routes = {
            ("GET", "/weight_info"),
            ("POST", "/update_weight_version"),
            ("POST", "/pause"),
            ("POST", "/resume"),
            ("GET", "/is_paused"),
            ("GET", "/is_sleeping"),
        }
        if path not in {p for _, p in routes}:
            return None
        if not self.dev_mode:
            return 404, {"detail": "Not Found"}
        if (method if method != "HEAD" else "GET", path) not in routes:
            return 405, {"detail": "Method Not Allowed"}
        ep = self._endpoint
        with ep._lock:
            if path == "/weight_info":
                return 200, {"weight_version": self.version}
            asleep = any(e.sleep_level > 0 for e in ep.engines)
            if path == "/is_paused":  # vLLM: a sleep pauses the scheduler
                return 200, {"is_paused": self.paused or asleep}
            if path == "/is_sleeping":  # vLLM: true during a plain pause too
                return 200, {"is_sleeping": self.paused or asleep}
            if path == "/pause":
                self.pause()
                ep._touch()
                return 200, {"status": "paused"}
            if path == "/resume":
                self.resume()
                ep._touch()
                return 200, {"status": "resumed"}
            try:
                data = json.loads(body or b"null")
            except ValueError:
                data = None
            version = data.get("new_version") if isinstance(data, dict) else None
            if not isinstance(version, str):
                return 400, {
                    "error": {
                        "message": "1 validation error: body.new_version",
                        "type": "Bad Request",
                        "param": "body.new_version",
                        "code": 400,
                    }
                }
            self.set_version(version)
            return 200, {"success": True, "new_version": version}

    # -- exposition ----------------------------------------------------------------------------
    def families(self, single: bool) -> list[tuple[str, str, str, list[Any]]]:
        """The RL histogram and in-flight gauge families (none before the first call)."""
        hist = self.family(single)
        if hist is None and not self.in_flight:
            return []
        rows = [
            (RL_IN_FLIGHT_FAMILY, (("operation", op),), n)
            for op, n in sorted(self.in_flight.items())
        ]
        gauge = (RL_IN_FLIGHT_FAMILY, "gauge", RL_IN_FLIGHT_HELP, rows)
        return [f for f in (hist, gauge) if f is not None and f[3]]

    def family(self, single: bool) -> tuple[str, str, str, list[Any]] | None:
        """The RL histogram family (None until its first observation)."""
        if not self.operations:
            return None
        from .endpoint import _histogram_rows

        base = RL_OPERATION_FAMILY
        rows: list[Any] = []
        for op in sorted(self.operations):
            labels = (("operation", op),)
            created = self.created[op] if single else None
            _histogram_rows(rows, base, labels, self.operations[op], created, single)
        return base, "histogram", RL_OPERATION_HELP, rows
