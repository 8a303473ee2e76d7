"""One simulated SGLang 0.5.x server: a tokenizer process and one scheduler per DP replica.

The body is what SGLang 0.5.23 serves (``tests/data/sglang-0.5.23/`` has real ones): the
``sglang:`` families of :mod:`~fleetscope_sim.sglang_families` in prometheus
multiprocess mode (no ``_created``, no ``process_*``), scheduler families labelled
``engine_type, model_name, moe_ep_rank, pp_rank, tp_rank`` (+ ``dp_rank`` with several
replicas), tokenizer families ``engine_type, model_name`` (+ ``is_streaming`` /
``cache_source``). ``engine_type`` is the role (``prefill`` / ``decode``; ``unified`` without
one), so fleetscope learns P/D roles from the body.

Ground truth: each replica's scheduler families in ``engine.truth``, the tokenizer's in
``endpoint.truth`` (never reset); ``endpoint.truth_total(family, *key)`` reads either.

Side routes as SGLang 0.5.23 answers them: ``/v1/models`` (``owned_by: "sglang"``,
``max_model_len``), ``/server_info`` and its deprecated alias ``/get_server_info`` (with
``version``), ``/model_info``; ``/version`` and ``/get_metrics_worker_info`` are 404 (SGLang has
neither).
"""

from __future__ import annotations

import math
from typing import Any

from .clock import ProcessState
from .endpoint import SimEndpoint
from .endpoint_exposition import FamilyRows
from .engine import SimEngine
from .exposition_rows import LabelPairs, SampleRow, histogram_rows
from .ledger import Ledger
from .sglang_engine import SglangEngine
from .sglang_families import FAMILIES, SGLANG_VERSION, SglangFamily

_NOT_FOUND = (404, {"detail": "Not Found"})


class SglangEndpoint(SimEndpoint):
    """A simulated SGLang server with ``dp`` scheduler replicas (always multiprocess mode)."""

    engine_kind = "sglang"
    server_version = SGLANG_VERSION
    engine_class: type[SimEngine] = SglangEngine

    def __init__(self, name: str = "server0", **kwargs: Any) -> None:
        kwargs["mode"] = "multiprocess"  # SGLang always sets PROMETHEUS_MULTIPROC_DIR
        super().__init__(name, **kwargs)

    @property
    def engine_type(self) -> str:
        """The ``engine_type`` label: the disaggregation mode."""
        return self.role or "unified"

    # -- state ---------------------------------------------------------------------------------
    def _reset_server_state(self, start_wall: float) -> None:
        start_wall = math.floor(start_wall * 100 + 1e-6) / 100
        self._process = ProcessState(start_wall=start_wall, start_sim=self._last_step_sim)
        self.exported = Ledger(self.record_observations)  # the tokenizer's families
        self.created = {}

    def _record_rejection(self, reason: str) -> None:
        """A full waiting queue drops the request (SGLang has no admission-rejection counter)."""

    def _record_http(self, handler: int, prompt_tokens: int, gen_tokens: int, e2e: float) -> None:
        """SGLang's HTTP families need ``--enable-http-metrics``: not simulated."""

    # -- rendering -----------------------------------------------------------------------------
    def _families(self) -> list[FamilyRows]:
        families: list[FamilyRows] = []
        for spec in FAMILIES:
            rows = self._scheduler_rows(spec) if spec.owner == "scheduler" else self._tok_rows(spec)
            if rows:  # a multiprocess body has no family without samples
                base = spec.name[:-6] if spec.kind == "counter" else spec.name
                families.append((base, spec.kind, spec.help, rows))
        return families

    def _labels(self, engine: SimEngine | None, label: str | None, value: str | None) -> LabelPairs:
        key = ("" if engine is None else engine.label, label, (value,) if value else ())
        cached = self._child_label_cache.get(key)
        if cached is None:
            if engine is None:
                cached = tokenizer_labels(self.engine_type, self.model_name, label, value)
            else:
                dp = engine.label if len(self.engines) > 1 else None
                cached = scheduler_labels(self.engine_type, self.model_name, dp, label, value)
            self._child_label_cache[key] = cached
        return cached

    def _scheduler_rows(self, spec: SglangFamily) -> list[SampleRow]:
        rows: list[SampleRow] = []
        name = spec.name
        for engine in self.engines:
            if spec.kind == "counter":
                for key, value in engine.exported.counters.get(name, {}).items():
                    rows.append((name, self._labels(engine, spec.label, _first(key)), value))
            elif spec.kind == "histogram":
                hist = engine.exported.histograms.get(name, {}).get(())
                if hist is not None:
                    labels = self._labels(engine, None, None)
                    histogram_rows(rows, name, labels, hist, None, single=False)
            elif name in engine.gauges:
                if engine.has_stepped:
                    rows.append((name, self._labels(engine, None, None), engine.gauges[name][()]))
            else:
                assert isinstance(engine, SglangEngine)
                rows.append((name, self._labels(engine, None, None), engine.constants()[name]))
        return rows

    def _tok_rows(self, spec: SglangFamily) -> list[SampleRow]:
        rows: list[SampleRow] = []
        name = spec.name
        if spec.kind == "counter":
            for key, value in self.exported.counters.get(name, {}).items():
                rows.append((name, self._labels(None, spec.label, _first(key)), value))
        else:
            for key, hist in self.exported.histograms.get(name, {}).items():
                labels = self._labels(None, spec.label, _first(key))
                histogram_rows(rows, name, labels, hist, None, single=False)
        return rows

    # -- side routes -----------------------------------------------------------------------------
    def models_json(self) -> dict[str, Any]:
        """``GET /v1/models`` as SGLang answers it (``ModelCard``)."""
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": int(self._process.start_wall),
                    "owned_by": "sglang",
                    "root": self.model_name,
                    "parent": None,
                    "max_model_len": self.max_model_len,
                }
            ],
        }

    def server_info(self) -> dict[str, Any]:
        """``GET /server_info`` (a few of SGLang's fields; the real one has every server arg)."""
        return {
            "model_path": self.model_name,
            "served_model_name": self.model_name,
            "dp_size": len(self.engines),
            "tp_size": 1,
            "disaggregation_mode": self.role or "null",
            "context_length": self.max_model_len,
            "enable_metrics": True,
            "version": self.server_version,
            "frontend": "python",
        }

    def json_route(self, path: str) -> tuple[int, Any] | None:
        if path in ("/server_info", "/get_server_info"):
            return 200, self.server_info()
        if path == "/model_info":
            return 200, {
                "model_path": self.model_name,
                "served_model_name": self.model_name,
                "is_generation": True,
                "weight_version": self.rl.version,
                "disaggregation_mode": self.role or "null",
            }
        if path in ("/version", "/get_metrics_worker_info"):
            return _NOT_FOUND
        return None


def _first(key: tuple[str, ...]) -> str | None:
    return key[0] if key else None


def scheduler_labels(
    engine_type: str, model: str, dp_rank: str | None, label: str | None, value: str | None
) -> LabelPairs:
    """A scheduler child's labels, sorted as the multiprocess collector writes them (TP, PP
    and MoE-EP rank 0: the rank that logs)."""
    labels = {
        "engine_type": engine_type,
        "model_name": model,
        "moe_ep_rank": "0",
        "pp_rank": "0",
        "tp_rank": "0",
    }
    if dp_rank is not None:
        labels["dp_rank"] = dp_rank
    if label and value is not None:
        labels[label] = value
    return tuple(sorted(labels.items()))


def tokenizer_labels(
    engine_type: str, model: str, label: str | None, value: str | None
) -> LabelPairs:
    """A tokenizer child's labels (no ranks: one tokenizer serves every replica)."""
    labels = {"engine_type": engine_type, "model_name": model}
    if label and value is not None:
        labels[label] = value
    return tuple(sorted(labels.items()))
