"""Fault injection and controls of a simulated vLLM API server.

HTTP faults of ``/metrics`` (``EndpointFaults``: slow, error status, garbage, truncated, huge,
wrong content type, disconnect, NaN values, duplicate series), whole-server and engine restarts,
engine stalls and slowdowns, load changes, sleep / wake-up, lazily grown series and bucket-layout
changes. ``EndpointFaultInjection`` is a mixin of
:class:`~fleetscope_sim.endpoint.SimEndpoint` (every method takes the endpoint's lock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .engine import SimEngine
from .engine_metrics import LAZY_SERIES_DONORS
from .ledger import Ledger, Truth

if TYPE_CHECKING:
    from .clock import ProcessState
    from .rl import SimRL


@dataclass
class EndpointFaults:
    """The HTTP faults an endpoint's ``/metrics`` currently applies (see ``SimEndpoint``)."""

    slow_seconds: float = 0.0
    http_status: int | None = None
    garbage: bool = False
    truncated: bool = False
    huge_body_mb: float | None = None
    content_type: str | None = None
    disconnect: bool = False
    nan_values: bool = False
    duplicate_series: bool = False


class EndpointFaultInjection:
    """The fault and control methods of ``SimEndpoint``."""

    # set by SimEndpoint
    engines: list[SimEngine]
    faults: EndpointFaults
    restarts: int
    restart_hooks: list[Callable[[], None]]
    truth: Truth
    exported: Ledger
    rl: SimRL
    _lock: threading.RLock
    _process: ProcessState
    _last_step_sim: float

    if TYPE_CHECKING:

        def _touch(self) -> None: ...

        def _wall_now(self) -> float: ...

        def _reset_server_state(self, start_wall: float) -> None: ...

        def _engine_start(self, index: int) -> float: ...

    # -- faults: HTTP ---------------------------------------------------------------------------
    def _set_faults(self, **changes: Any) -> None:
        with self._lock:
            self.faults = replace(self.faults, **changes)

    def set_slow(self, seconds: float) -> None:
        """Answer ``/metrics`` only after ``seconds`` (other endpoints are not delayed)."""
        self._set_faults(slow_seconds=max(0.0, float(seconds)))

    def set_http_error(self, status: int = 500) -> None:
        """Answer ``/metrics`` with HTTP ``status`` and a short text body."""
        self._set_faults(http_status=int(status))

    def set_garbage(self, enabled: bool = True) -> None:
        """Answer ``/metrics`` 200 with a body that is not Prometheus text (``GARBAGE_BODY``)."""
        self._set_faults(garbage=enabled)

    def set_truncated(self, enabled: bool = True) -> None:
        """Send the full ``Content-Length`` but only half of the body, then close."""
        self._set_faults(truncated=enabled)

    def set_huge_body(self, megabytes: float) -> None:
        """Pad the (valid) body with comment lines to ``megabytes`` MiB (0 turns it off)."""
        self._set_faults(huge_body_mb=float(megabytes) or None)

    def set_content_type(self, content_type: str | None) -> None:
        """Answer ``/metrics`` with another ``Content-Type`` (``None`` restores vLLM's)."""
        self._set_faults(content_type=content_type)

    def set_disconnect(self, enabled: bool = True) -> None:
        """Close the connection on ``/metrics`` without sending any response."""
        self._set_faults(disconnect=enabled)

    def set_nan_values(self, enabled: bool = True) -> None:
        """Write ``NaN`` as the value of ``kv_cache_usage_perc`` and ``generation_tokens_total``."""
        self._set_faults(nan_values=enabled)

    def set_duplicate_series(self, enabled: bool = True) -> None:
        """Write the first ``vllm:prompt_tokens_total`` sample line twice."""
        self._set_faults(duplicate_series=enabled)

    def clear_faults(self) -> None:
        """Remove every HTTP fault and engine stall/slowdown (not restarts, lazy series, bucket
        changes, sleep or load changes)."""
        with self._lock:
            self.faults = EndpointFaults()
            for engine in self.engines:
                engine.stall(False)
                engine.slowdown = 1.0
            self._touch()

    # -- faults: process and engines -------------------------------------------------------------
    def restart(self) -> None:
        """Restart the whole API server: every engine and the server's own series start from 0,
        ``_created`` and ``process_start_time_seconds`` move to now (strictly later than before),
        in multiprocess mode the per-step gauges vanish until the next step, in-flight requests
        are lost. Ground truth keeps counting and records the restart."""
        with self._lock:
            start = max(self._wall_now(), self._process.start_wall + 0.01)
            self.truth.restarts += 1
            self.truth.restart_times.append(self._last_step_sim)
            self.truth.lost_at_restart.append(
                {f: dict(s) for f, s in self.exported.counters.items()}
            )
            self.restarts += 1
            self._reset_server_state(start)
            for i, engine in enumerate(self.engines):
                engine.restart(self._engine_start(i))
            self.rl.reset()
            self._touch()
        for hook in self.restart_hooks:
            hook()

    def restart_engine(self, index: int) -> None:
        """Restart one engine core only (its series reset, new ``_created``); the API server
        process, its start time and its own series are unchanged."""
        with self._lock:
            self.engines[index].restart()
            self._touch()

    def _engines(self, engine: int | None) -> list[SimEngine]:
        return self.engines if engine is None else [self.engines[engine]]

    def stall(self, engine: int | None = None) -> None:
        """Stall one engine (or all): requests stay running, no token is generated."""
        with self._lock:
            for e in self._engines(engine):
                e.stall(True)

    def unstall(self, engine: int | None = None) -> None:
        """Undo ``stall``."""
        with self._lock:
            for e in self._engines(engine):
                e.stall(False)

    def set_slowdown(self, factor: float, engine: int | None = None) -> None:
        """Make one engine's (or all engines') iterations ``factor`` times longer."""
        with self._lock:
            for e in self._engines(engine):
                e.set_slowdown(factor)

    def set_arrival_rate(self, rate: float, engine: int | None = None) -> None:
        """Change the request rate (per engine, requests/s) from now on."""
        with self._lock:
            for e in self._engines(engine):
                e.set_arrival_rate(rate)

    def sleep(self, level: int = 1, engine: int | None = None) -> None:
        """What ``POST /sleep?level=`` does to the engines (the scheduler pauses; level 1 and 2
        put the executor to sleep; ``engine_sleep_state`` changes now), untimed, on one engine
        or all (see :mod:`~fleetscope_sim.rl_sleep`)."""
        with self._lock:
            for e in self._engines(engine):
                e.sleep(level)
            self._touch()

    def wake_up(self, engine: int | None = None) -> None:
        """What ``POST /wake_up`` does (untimed): wake every tag, resume the scheduler."""
        with self._lock:
            for e in self._engines(engine):
                e.wake_up()
            self._touch()

    def add_lazy_series(
        self,
        family: str = "vllm:request_success_total",
        value: str = "timeout",
        share: float = 0.25,
        engine: int | None = None,
    ) -> None:
        """Grow a new labelled series mid-run, as vLLM multiprocess mode and Ray do.

        From now on ``share`` of the increments that would go to the family's donor child
        (``finished_reason="stop"``, ``source="local_compute"`` or ``source="device"``, see
        ``LAZY_SERIES_DONORS``) go to a new child ``value`` instead, so family sums stay exact.
        The child counts from 0 and first appears (with its ``_created``) in the step that first
        increments it -- with a non-zero value, like a prometheus_client child created on use.
        """
        if family not in LAZY_SERIES_DONORS:
            raise ValueError(f"lazy series supported in {sorted(LAZY_SERIES_DONORS)}")
        with self._lock:
            for e in self._engines(engine):
                e.add_lazy_series(family, value, share)

    def change_buckets(
        self, family: str, bounds: Iterable[float], engine: int | None = None
    ) -> None:
        """Export histogram ``family`` with other finite bucket ``bounds`` (like a server with
        another ``max_model_len``). Existing observations are re-counted exactly in the new
        layout (needs ``record_observations=True`` once something was observed)."""
        bounds_tuple = tuple(float(b) for b in bounds)
        with self._lock:
            for e in self._engines(engine):
                e.change_buckets(family, bounds_tuple)
            self._touch()
