"""One simulated vLLM API server (an *endpoint*): its engines, its registry, its faults.

The exposition is produced by a real ``prometheus_client.CollectorRegistry`` holding one custom
collector that reads the engines' frozen state, rendered with ``generate_latest`` -- so the bytes
are exactly what prometheus_client writes (sorted labels, ``_created`` families after each
family, ``floatToGoString`` values). A custom collector (rather than ``Counter``/``Histogram``
objects) is what makes the simulator controllable: ``_created`` and process start times follow
the simulated clock, multiprocess mode can be emulated, and values only change in ``step()``.

Two exposition modes:

* ``"single"`` -- one API server process (vLLM without data parallelism): ``python_*`` and
  ``process_*`` families first, every counter/histogram child followed (per family) by its
  ``_created`` gauge family.
* ``"multiprocess"`` -- ``PROMETHEUS_MULTIPROC_DIR`` mode vLLM switches to with
  ``--data-parallel-size > 1``: families grouped counters / gauges / summaries / histograms, no
  ``_created``, no process families, histogram children written ``_sum``, buckets, ``_count``,
  labelled children ordered by label value then engine, and the per-step gauges
  (``num_requests_running``, ``num_requests_waiting``, ``num_requests_waiting_by_reason``,
  ``kv_cache_usage_perc``) without any sample until the engine's first step.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from .engine import LAZY_SERIES_DONORS, LoadProfile, Role, SimEngine
from .ledger import HistogramCounts, Ledger, SeriesKey, Truth
from .rl import SimRL
from .vllm_families import (
    CACHE_CONFIG_INFO_LABELS,
    FAMILIES,
    FAMILIES_BY_NAME,
    HTTP_FAMILIES,
    HTTP_HANDLERS,
    HTTP_LABEL_NAMES,
    MULTIPROCESS_KIND_ORDER,
    PROCESS_FAMILIES,
    PYTHON_INFO_LABELS,
    FamilySpec,
)

Mode = Literal["single", "multiprocess"]

#: what a simulated vLLM server answers on ``GET /version``
VLLM_VERSION = "0.32.0"

#: Content type vLLM (prometheus_client) answers ``/metrics`` with.
CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"

#: What ``set_garbage()`` serves: an HTML error page with binary junk, not Prometheus text.
GARBAGE_BODY = (
    b"<html><head><title>502 Bad Gateway</title></head>\n"
    b'<body>\x00\x01\x02 upstream sent }{ vllm:num_requests_running{engine="0" 1.0.0 ##\n'
    b"</body></html>\n"
)

_INF = float("inf")

_Labels = tuple[tuple[str, str], ...]
_Row = tuple[str, _Labels, float]  # sample name, labels, value
_Family = tuple[str, str, str, list[_Row]]  # base name, type, help, rows


class SimClock:
    """Simulated time shared by a fleet: ``sim_time`` seconds since start, and a wall clock.

    ``wall()`` is ``wall_start + sim_time``: the unix time the simulated servers believe it is
    (used for ``_created`` and ``process_start_time_seconds``). When the fleet is stepped by real
    elapsed time (``serve_forever``), it tracks the real clock.
    """

    def __init__(self, wall_start: float | None = None) -> None:
        self.wall_start = time.time() if wall_start is None else float(wall_start)
        self.sim_time = 0.0

    def wall(self) -> float:
        """Simulated unix time now."""
        return self.wall_start + self.sim_time

    def advance(self, dt: float) -> None:
        """Move simulated time forward by ``dt`` seconds."""
        if dt < 0:
            raise ValueError("time only moves forward")
        self.sim_time += dt


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


class _EndpointCollector(Collector):
    """prometheus_client collector reading a ``SimEndpoint``'s frozen state."""

    def __init__(self, endpoint: SimEndpoint) -> None:
        self._endpoint = endpoint

    def collect(self) -> Iterable[Metric]:
        return self._endpoint._collect()


@dataclass
class _ProcessState:
    start_wall: float
    start_sim: float
    cpu_seconds: float = 0.0


class SimEndpoint:
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
        self._version = 0
        #: serve ``render_fast()`` (identical bytes, cheaper) instead of ``render()``
        self.fast_render = True
        self._cache: tuple[int, bytes] | None = None
        self._label_strings: dict[_Labels, str] = {}
        self._child_label_cache: dict[tuple[str, str | None, SeriesKey], _Labels] = {}
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
        self.registry.register(_EndpointCollector(self))

    # -- state --------------------------------------------------------------------------------
    def _reset_server_state(self, start_wall: float) -> None:
        # process_start_time_seconds has 10 ms resolution, as prometheus_client's.
        start_wall = math.floor(start_wall * 100 + 1e-6) / 100
        self._process = _ProcessState(start_wall=start_wall, start_sim=self._last_step_sim)
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
        for engine in self.engines:
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

    # -- rendering -----------------------------------------------------------------------------
    def render(self, use_cache: bool = True) -> bytes:
        """The ``/metrics`` body (no faults applied) as ``generate_latest`` writes it from the
        endpoint's registry; rendered once per state change (cached)."""
        with self._lock:
            if use_cache and self._cache is not None and self._cache[0] == self._version:
                return self._cache[1]
            body = generate_latest(self.registry)
            self._cache = (self._version, body)
            return body

    def render_fast(self, use_cache: bool = True) -> bytes:
        """Byte-for-byte the same body as ``render()``, serialized without prometheus_client's
        per-sample overhead (label strings are cached per series): ~5x cheaper, for big
        fleets (``fast_render=True``, the default, makes ``/metrics`` use it). Cached like
        ``render()``."""
        with self._lock:
            if use_cache and self._cache is not None and self._cache[0] == self._version:
                return self._cache[1]
            body = self._serialize_fast()
            self._cache = (self._version, body)
            return body

    def body(self) -> bytes:
        """``render_fast()`` if ``fast_render`` else ``render()``."""
        return self.render_fast() if self.fast_render else self.render()

    def _collect(self) -> list[Metric]:
        """prometheus_client ``Metric`` objects of the current state (for the registry)."""
        metrics = []
        for base, kind, help_text, rows in self._families():
            metric = Metric(base, help_text, kind)
            metric.samples = [Sample(name, dict(labels), value) for name, labels, value in rows]
            metrics.append(metric)
        return metrics

    def _serialize_fast(self) -> bytes:
        parts: list[str] = []
        label_cache = self._label_strings
        go = floatToGoString
        for base, kind, help_text, rows in self._families():
            header = self._headers.get(base)
            if header is None:
                header = self._headers[base] = _family_headers(base, kind, help_text)
            parts.append(header[0])
            created_name = base + "_created"
            created_lines: list[str] = []
            for name, labels, value in rows:
                text = label_cache.get(labels)
                if text is None:
                    text = label_cache[labels] = _label_string(labels)
                line = f"{name}{text} {go(value)}\n"
                if name == created_name:
                    created_lines.append(line)
                else:
                    parts.append(line)
            if created_lines:
                parts.append(header[1])
                parts.extend(created_lines)
        return "".join(parts).encode("utf-8")

    def _families(self) -> list[_Family]:
        """Every family of the body in exposition order, as (base name, type, help, rows)."""
        single = self.mode == "single"
        families: list[_Family] = []
        if single:
            families.extend(self._process_families())
        for spec in FAMILIES:
            families.append(self._vllm_family(spec, single))
        for spec in HTTP_FAMILIES:
            family = self._http_family(spec, single)
            if single or family[3]:
                families.append(family)
        families.extend(self.rl.families(single))
        if not single:
            families.sort(key=lambda f: MULTIPROCESS_KIND_ORDER[f[1]])
        return families

    def _child_labels(self, engine: SimEngine, label: str | None, key: SeriesKey) -> _Labels:
        cache_key = (engine.label, label, key)
        labels = self._child_label_cache.get(cache_key)
        if labels is None:
            labels = (("engine", engine.label), ("model_name", self.model_name))
            if label and key:
                labels += ((label, key[0]),)
            self._child_label_cache[cache_key] = labels
        return labels

    def _vllm_family(self, spec: FamilySpec, single: bool) -> _Family:
        kind = spec.kind
        base = spec.name[:-6] if kind == "counter" else spec.name
        rows: list[_Row] = []
        if kind == "counter":
            total, created = base + "_total", base + "_created"
            if spec.per_engine:
                series = self._engine_series(lambda e: e.exported.counters[spec.name], single)
                for engine, key, value in series:
                    labels = self._child_labels(engine, spec.label, key)
                    rows.append((total, labels, value))
                    if single:
                        rows.append((created, labels, engine.created[(spec.name, key)]))
            else:
                for key, value in self.exported.counters[spec.name].items():
                    labels = (("model_name", self.model_name),)
                    if key and spec.label:
                        labels += ((spec.label, key[0]),)
                    rows.append((total, labels, value))
                    if single:
                        rows.append((created, labels, self.created[(spec.name, key)]))
        elif kind == "gauge":
            if spec.name == "vllm:cache_config_info":
                for engine in self.engines:
                    rows.append((spec.name, self._cache_config_labels(engine), 1.0))
            else:
                engines = [
                    e for e in self.engines if single or e.has_stepped or not spec.set_each_step
                ]
                series = self._engine_series(lambda e: e.gauges[spec.name], single, engines)
                for engine, key, value in series:
                    rows.append((spec.name, self._child_labels(engine, spec.label, key), value))
        else:
            for engine in self.engines:
                hist = engine.exported.histograms[spec.name][()]
                hcreated = engine.created[(spec.name, ())] if single else None
                labels = self._child_labels(engine, None, ())
                _histogram_rows(rows, base, labels, hist, hcreated, single)
        return base, kind, spec.help, rows

    def _engine_series(
        self,
        series_of: Callable[[SimEngine], dict[SeriesKey, float]],
        single: bool,
        engines: list[SimEngine] | None = None,
    ) -> list[tuple[SimEngine, SeriesKey, float]]:
        """(engine, key, value) per engine and breakdown value: engine-major in single mode,
        value-major (then engine) in multiprocess mode, as the two writers order them."""
        engines = self.engines if engines is None else engines
        if single:
            return [(e, key, value) for e in engines for key, value in series_of(e).items()]
        keys: dict[SeriesKey, None] = {}
        for e in engines:
            keys.update(dict.fromkeys(series_of(e)))
        rows = []
        for key in keys:
            for e in engines:
                series = series_of(e)
                if key in series:
                    rows.append((e, key, series[key]))
        return rows

    def _cache_config_labels(self, engine: SimEngine) -> _Labels:
        cached = self._child_label_cache.get((engine.label, "cache_config_info", ()))
        if cached is not None:
            return cached
        lp = engine.load
        tokens = engine.total_blocks * lp.block_size
        labels = {
            **CACHE_CONFIG_INFO_LABELS,
            "block_size": str(lp.block_size),
            "effective_attention_block_size": str(lp.block_size),
            "num_gpu_blocks": str(engine.total_blocks),
            "kv_cache_size_tokens": str(tokens),
            "kv_cache_max_concurrency": str(tokens / self.max_model_len),
            "kv_cache_memory_bytes": str(tokens * lp.kv_bytes_per_token),
            "engine": engine.label,
        }
        result = tuple(labels.items())
        self._child_label_cache[(engine.label, "cache_config_info", ())] = result
        return result

    def _process_families(self) -> list[_Family]:
        proc = self._process
        up = max(0.0, self._last_step_sim - proc.start_sim)
        values: dict[str, dict[SeriesKey, float]] = {
            "python_gc_objects_collected_total": {
                ("0",): float(int(9000 + 120 * up)),
                ("1",): float(int(1200 + 15 * up)),
                ("2",): float(int(400 + 4 * up)),
            },
            "python_gc_objects_uncollectable_total": {("0",): 0.0, ("1",): 0.0, ("2",): 0.0},
            "python_gc_collections_total": {
                ("0",): float(int(900 + 12 * up)),
                ("1",): float(int(80 + up)),
                ("2",): float(int(6 + up / 60)),
            },
            "process_virtual_memory_bytes": {(): 2.199691264e9},
            "process_resident_memory_bytes": {(): 6.40131072e8},
            "process_start_time_seconds": {(): proc.start_wall},
            "process_cpu_seconds_total": {(): round(proc.cpu_seconds, 2)},
            "process_open_fds": {(): 34.0},
            "process_max_fds": {(): 20000.0},
        }
        families: list[_Family] = []
        for spec in PROCESS_FAMILIES:
            base = spec.name[:-6] if spec.kind == "counter" else spec.name
            rows: list[_Row] = []
            if spec.name == "python_info":
                rows.append(("python_info", tuple(PYTHON_INFO_LABELS.items()), 1.0))
            else:
                for key, value in values[spec.name].items():
                    labels = ((spec.label, key[0]),) if key and spec.label else ()
                    rows.append((spec.name, labels, value))
            families.append((base, spec.kind, spec.help, rows))
        return families

    def _http_family(self, spec: FamilySpec, single: bool) -> _Family:
        kind = spec.kind
        base = spec.name[:-6] if kind == "counter" else spec.name
        names = HTTP_LABEL_NAMES[spec.name]
        rows: list[_Row] = []
        created_name = base + "_created"
        if kind == "counter":
            for key, value in self.exported.counters.get(spec.name, {}).items():
                labels = tuple(zip(names, key, strict=True))
                rows.append((base + "_total", labels, value))
                if single:
                    rows.append((created_name, labels, self.created[(spec.name, key)]))
        elif kind == "summary":
            for key, (count, total) in self.exported.summaries.get(spec.name, {}).items():
                labels = tuple(zip(names, key, strict=True))
                rows.append((base + "_count", labels, count))
                rows.append((base + "_sum", labels, total))
                if single:
                    rows.append((created_name, labels, self.created[(spec.name, key)]))
        else:
            for key, hist in self.exported.histograms.get(spec.name, {}).items():
                labels = tuple(zip(names, key, strict=True))
                created = self.created[(spec.name, key)] if single else None
                _histogram_rows(rows, base, labels, hist, created, single)
        return base, kind, spec.help, rows

    # -- HTTP answers ----------------------------------------------------------------------------
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
        or all (see :mod:`~fleetscope.simulate.rl_sleep`)."""
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


def _histogram_rows(
    rows: list[_Row],
    base: str,
    labels: _Labels,
    hist: HistogramCounts,
    created: float | None,
    single: bool,
) -> None:
    """Append one histogram child's samples in the order the two writers use."""
    buckets = [
        (base + "_bucket", (*labels, ("le", _le(bound))), float(cum))
        for bound, cum in zip((*hist.bounds, _INF), hist.cumulative(), strict=True)
    ]
    if single:
        rows.extend(buckets)
        rows.append((base + "_count", labels, float(hist.count)))
        rows.append((base + "_sum", labels, hist.sum))
        if created is not None:
            rows.append((base + "_created", labels, created))
    else:
        rows.append((base + "_sum", labels, hist.sum))
        rows.extend(buckets)
        rows.append((base + "_count", labels, float(hist.count)))


_LE_STRINGS: dict[float, str] = {}


def _le(bound: float) -> str:
    text = _LE_STRINGS.get(bound)
    if text is None:
        text = _LE_STRINGS[bound] = floatToGoString(bound)
    return text


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _label_string(labels: _Labels) -> str:
    """``{a="x",b="y"}`` with names sorted, as ``generate_latest`` writes labels."""
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in sorted(labels))
    return "{" + inner + "}"


def _family_headers(base: str, kind: str, help_text: str) -> tuple[str, str]:
    """HELP/TYPE lines of a family and of its ``_created`` gauge family."""
    doc = help_text.replace("\\", r"\\").replace("\n", r"\n")
    name = base + "_total" if kind == "counter" else base
    return (
        f"# HELP {name} {doc}\n# TYPE {name} {kind}\n",
        f"# HELP {base}_created {doc}\n# TYPE {base}_created gauge\n",
    )


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
