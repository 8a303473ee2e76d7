"""The families a vLLM 0.32 API server process exposes besides the ``vllm:`` ones, as plain data.

``PROCESS_FAMILIES`` (prometheus_client's ``python_*`` / ``process_*``, written first, only in
normal mode) and ``HTTP_FAMILIES`` (prometheus-fastapi-instrumentator's ``http_*``, written last),
read off the same real bodies as :mod:`~fleetscope_sim.vllm_families` (HELP texts byte for
byte: the ``http_*`` ones end with a space).
"""

from __future__ import annotations

from .family_spec import FamilySpec

# Bucket layouts of the HTTP histograms seen in vLLM 0.32.
HTTP_HIGHR_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
    7.5, 10.0, 30.0, 60.0,
)  # fmt: skip
HTTP_DURATION_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1.0)

#: Families with process-lifetime (not per-engine) values, written first in normal mode only.
#: Label names of the labelled ones: ``python_gc_*`` -> ``generation``; ``python_info`` -> the
#: ``PYTHON_INFO_LABELS`` keys.
PROCESS_FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec(
        "python_gc_objects_collected_total",
        "counter",
        "Objects collected during gc",
        label="generation",
        label_values=("0", "1", "2"),
        per_engine=False,
    ),
    FamilySpec(
        "python_gc_objects_uncollectable_total",
        "counter",
        "Uncollectable objects found during GC",
        label="generation",
        label_values=("0", "1", "2"),
        per_engine=False,
    ),
    FamilySpec(
        "python_gc_collections_total",
        "counter",
        "Number of times this generation was collected",
        label="generation",
        label_values=("0", "1", "2"),
        per_engine=False,
    ),
    FamilySpec("python_info", "gauge", "Python platform information", per_engine=False),
    FamilySpec(
        "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", per_engine=False
    ),
    FamilySpec(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        per_engine=False,
    ),
    FamilySpec(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        per_engine=False,
    ),
    FamilySpec(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        per_engine=False,
    ),
    FamilySpec("process_open_fds", "gauge", "Number of open file descriptors.", per_engine=False),
    FamilySpec(
        "process_max_fds", "gauge", "Maximum number of open file descriptors.", per_engine=False
    ),
)

PYTHON_INFO_LABELS: dict[str, str] = {
    "implementation": "CPython",
    "major": "3",
    "minor": "11",
    "patchlevel": "7",
    "version": "3.11.7",
}

#: prometheus-fastapi-instrumentator families of the API server (per endpoint, no ``engine``).
#: Label names: ``http_requests_total`` -> handler, method, status; the two summaries ->
#: handler; ``http_request_duration_seconds`` -> handler, method; ``..._highr_seconds`` -> none.
HTTP_FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec(
        "http_requests_total",
        "counter",
        "Total number of requests by method, status and handler.",
        per_engine=False,
    ),
    FamilySpec(
        "http_request_size_bytes",
        "summary",
        "Content length of incoming requests by handler. Only value of header is respected."
        " Otherwise ignored. No percentile calculated. ",
        per_engine=False,
    ),
    FamilySpec(
        "http_response_size_bytes",
        "summary",
        "Content length of outgoing responses by handler. Only value of header is respected."
        " Otherwise ignored. No percentile calculated. ",
        per_engine=False,
    ),
    FamilySpec(
        "http_request_duration_highr_seconds",
        "histogram",
        "Latency with many buckets but no API specific labels. Made for more accurate percentile"
        " calculations. ",
        per_engine=False,
        buckets=HTTP_HIGHR_BUCKETS,
    ),
    FamilySpec(
        "http_request_duration_seconds",
        "histogram",
        "Latency with only few buckets by handler. Made to be only used if aggregation by handler"
        " is important. ",
        per_engine=False,
        buckets=HTTP_DURATION_BUCKETS,
    ),
)

#: Label names of the HTTP families (children appear when the first request of a handler ends).
HTTP_LABEL_NAMES: dict[str, tuple[str, ...]] = {
    "http_requests_total": ("handler", "method", "status"),
    "http_request_size_bytes": ("handler",),
    "http_response_size_bytes": ("handler",),
    "http_request_duration_highr_seconds": (),
    "http_request_duration_seconds": ("handler", "method"),
}

#: The OpenAI routes the simulated requests go through.
HTTP_HANDLERS: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")
