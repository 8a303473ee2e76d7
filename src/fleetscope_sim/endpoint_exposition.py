"""The ``/metrics`` exposition of a simulated vLLM API server: its registry and its writers.

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

``EndpointExposition`` is the rendering part of :class:`~fleetscope_sim.endpoint.SimEndpoint`
(a mixin reading the endpoint's state, declared below); ``render_fast`` writes the same bytes as
``generate_latest`` without prometheus_client's per-sample overhead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from .exposition_rows import LabelPairs, SampleRow, go_string, histogram_rows
from .ledger import Ledger, SeriesKey
from .vllm_families import (
    CACHE_CONFIG_INFO_LABELS,
    FAMILIES,
    HTTP_FAMILIES,
    HTTP_LABEL_NAMES,
    MULTIPROCESS_KIND_ORDER,
    PROCESS_FAMILIES,
    PYTHON_INFO_LABELS,
    FamilySpec,
)

if TYPE_CHECKING:
    from .clock import ProcessState
    from .engine import SimEngine
    from .rl import SimRL

Mode = Literal["single", "multiprocess"]

FamilyRows = tuple[str, str, str, list[SampleRow]]  # base name, type, help, rows


class EndpointCollector(Collector):
    """prometheus_client collector reading a ``SimEndpoint``'s frozen state."""

    def __init__(self, endpoint: EndpointExposition) -> None:
        self._endpoint = endpoint

    def collect(self) -> Iterable[Metric]:
        return self._endpoint._collect()


class EndpointExposition:
    """The rendering part of ``SimEndpoint``: its ``/metrics`` body, from its frozen state."""

    # set by SimEndpoint
    mode: Mode
    model_name: str
    max_model_len: int
    engines: list[SimEngine]
    exported: Ledger
    created: dict[tuple[str, SeriesKey], float]
    rl: SimRL
    registry: CollectorRegistry
    fast_render: bool
    _lock: threading.RLock
    _version: int
    _cache: tuple[int, bytes] | None
    _label_strings: dict[LabelPairs, str]
    _child_label_cache: dict[tuple[str, str | None, SeriesKey], LabelPairs]
    _headers: dict[str, tuple[str, str]]
    _process: ProcessState
    _last_step_sim: float

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
        go = go_string
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

    def _families(self) -> list[FamilyRows]:
        """Every family of the body in exposition order, as (base name, type, help, rows)."""
        single = self.mode == "single"
        families: list[FamilyRows] = []
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

    def _child_labels(self, engine: SimEngine, label: str | None, key: SeriesKey) -> LabelPairs:
        cache_key = (engine.label, label, key)
        labels = self._child_label_cache.get(cache_key)
        if labels is None:
            labels = (("engine", engine.label), ("model_name", self.model_name))
            if label and key:
                labels += ((label, key[0]),)
            self._child_label_cache[cache_key] = labels
        return labels

    def _vllm_family(self, spec: FamilySpec, single: bool) -> FamilyRows:
        kind = spec.kind
        base = spec.name[:-6] if kind == "counter" else spec.name
        rows: list[SampleRow] = []
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
                histogram_rows(rows, base, labels, hist, hcreated, single)
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

    def _cache_config_labels(self, engine: SimEngine) -> LabelPairs:
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

    def _process_families(self) -> list[FamilyRows]:
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
        families: list[FamilyRows] = []
        for spec in PROCESS_FAMILIES:
            base = spec.name[:-6] if spec.kind == "counter" else spec.name
            rows: list[SampleRow] = []
            if spec.name == "python_info":
                rows.append(("python_info", tuple(PYTHON_INFO_LABELS.items()), 1.0))
            else:
                for key, value in values[spec.name].items():
                    labels = ((spec.label, key[0]),) if key and spec.label else ()
                    rows.append((spec.name, labels, value))
            families.append((base, spec.kind, spec.help, rows))
        return families

    def _http_family(self, spec: FamilySpec, single: bool) -> FamilyRows:
        kind = spec.kind
        base = spec.name[:-6] if kind == "counter" else spec.name
        names = HTTP_LABEL_NAMES[spec.name]
        rows: list[SampleRow] = []
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
                histogram_rows(rows, base, labels, hist, created, single)
        return base, kind, spec.help, rows


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _label_string(labels: LabelPairs) -> str:
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
