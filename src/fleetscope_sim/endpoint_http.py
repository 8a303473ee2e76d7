"""What a simulated vLLM API server answers besides the RL routes (see ``rl``).

``GET /metrics`` (the exposition with the endpoint's faults applied: ``MetricsResponse``),
``GET /v1/models``, ``GET /get_metrics_worker_info``, ``GET /version`` (``json_route``, per
engine kind), and the direct calls that change what the RL routes report (weight version,
weight update, pause). ``EndpointHTTPAnswers`` is a mixin of
:class:`~fleetscope_sim.endpoint.SimEndpoint`; the HTTP server
(:mod:`~fleetscope_sim.fleet_server`) calls it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from .engine import Role

if TYPE_CHECKING:
    from .endpoint import ProcessState
    from .endpoint_faults import EndpointFaults
    from .rl import SimRL

#: Content type vLLM (prometheus_client) answers ``/metrics`` with.
CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"

#: What ``set_garbage()`` serves: an HTML error page with binary junk, not Prometheus text.
GARBAGE_BODY = (
    b"<html><head><title>502 Bad Gateway</title></head>\n"
    b'<body>\x00\x01\x02 upstream sent }{ vllm:num_requests_running{engine="0" 1.0.0 ##\n'
    b"</body></html>\n"
)


@dataclass(frozen=True)
class MetricsResponse:
    """What the HTTP server must do for one ``GET /metrics``.

    Attributes:
        status: HTTP status code.
        body: bytes to send.
        content_type: ``Content-Type`` header value.
        delay_seconds: wait this long before answering.
        declared_length: when set, send this ``Content-Length`` (larger than ``body``) and
            close the connection after ``body`` (a truncated response).
        disconnect: close the connection without answering at all.
    """

    status: int
    body: bytes
    content_type: str = CONTENT_TYPE_LATEST
    delay_seconds: float = 0.0
    declared_length: int | None = None
    disconnect: bool = False


class EndpointHTTPAnswers:
    """The HTTP answers of ``SimEndpoint`` (``metrics_response``, ``models_json`` ...)."""

    # set by SimEndpoint
    server_version: str
    role: Role
    model_name: str
    max_model_len: int
    worker_id: str
    faults: EndpointFaults
    rl: SimRL
    _lock: threading.RLock
    _version: int
    _huge_cache: tuple[int, float, bytes] | None
    _process: ProcessState

    if TYPE_CHECKING:

        def body(self) -> bytes: ...

        def _touch(self) -> None: ...

    def metrics_response(self) -> MetricsResponse:
        """The answer to ``GET /metrics`` with the current faults applied (thread-safe)."""
        with self._lock:
            f = self.faults
            delay = f.slow_seconds
            content_type = f.content_type or CONTENT_TYPE_LATEST
            if f.disconnect:
                return MetricsResponse(0, b"", delay_seconds=delay, disconnect=True)
            if f.http_status is not None:
                phrase = _reason_phrase(f.http_status)
                body = f"{f.http_status} {phrase}\n".encode()
                return MetricsResponse(
                    f.http_status, body, "text/plain; charset=utf-8", delay_seconds=delay
                )
            if f.garbage:
                body = GARBAGE_BODY
            else:
                body = self.body()
                if f.nan_values:
                    body = _NAN_RE.sub(rb"\1 NaN", body)
                if f.duplicate_series:
                    body = _DUP_RE.sub(rb"\1\1", body, count=1)
                if f.huge_body_mb:
                    body = self._huge_body(body, f.huge_body_mb)
            declared = None
            if f.truncated:
                declared = len(body)
                body = body[: len(body) // 2]
            return MetricsResponse(200, body, content_type, delay, declared)

    def _huge_body(self, body: bytes, megabytes: float) -> bytes:
        cached = self._huge_cache
        if cached is not None and cached[0] == self._version and cached[1] == megabytes:
            return cached[2]
        target = int(megabytes * 1024 * 1024)
        line = b"# padding: a huge exposition (" + b"x" * 60 + b")\n"
        missing = max(0, target - len(body))
        padding = line * (missing // len(line) + 1)
        out = body + padding[:missing]
        if missing:
            out = out[:-1] + b"\n"
        self._huge_cache = (self._version, megabytes, out)
        return out

    def models_json(self) -> dict[str, Any]:
        """``GET /v1/models`` as vLLM answers it (with ``max_model_len``)."""
        created = int(self._process.start_wall)
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": self.model_name,
                    "parent": None,
                    "max_model_len": self.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{self.worker_id[:32]}",
                            "object": "model_permission",
                            "created": created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            ],
        }

    def update_weight_version(self, version: str) -> None:
        """Serve ``version`` from now on (``POST /update_weight_version``)."""
        with self._lock:
            self.rl.set_version(version)

    def simulate_weight_update(
        self, version: str | None = None, seconds: dict[str, float] | None = None
    ) -> None:
        """A weight transfer as vLLM's handlers record it: one observation of
        ``rl_weight_update_operation_duration_seconds`` per operation (default ``start``,
        ``update``, ``finish``; ``seconds`` per operation), then ``version`` if given (as
        ``/finish_weight_update {"weight_version": ...}`` sets it)."""
        ops = seconds if seconds is not None else {"start": 0.004, "update": 0.5, "finish": 0.003}
        with self._lock:
            for op, secs in ops.items():
                self.rl.observe_operation(op, secs)
            if version is not None:
                self.rl.set_version(version)
            self._touch()

    def pause(self) -> None:
        """``POST /pause?mode=keep``: running requests freeze until :meth:`resume`."""
        with self._lock:
            self.rl.pause()
            self._touch()

    def resume(self) -> None:
        with self._lock:
            self.rl.resume()
            self._touch()

    def json_route(self, path: str) -> tuple[int, Any] | None:
        """Routes an engine kind answers beyond the common ones: ``(status, JSON)``, or None
        (vLLM: ``GET /version`` -> ``{"version": "0.32.0"}``)."""
        if path == "/version":
            return 200, {"version": self.server_version}
        return None

    def worker_info(self) -> dict[str, Any]:
        """``GET /get_metrics_worker_info``: ``{"worker_id": ..., "role": ...}``."""
        return {"worker_id": self.worker_id, "role": self.role}


def _reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


_NAN_RE = re.compile(
    rb"^((?:vllm:kv_cache_usage_perc|vllm:generation_tokens_total)\{[^\n]*\}) [^\n]+$",
    re.MULTILINE,
)
_DUP_RE = re.compile(rb"^(vllm:prompt_tokens_total\{[^\n]*\n)", re.MULTILINE)
