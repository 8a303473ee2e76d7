"""What a simulated vLLM engine core records: its series, counters, histograms and gauges.

Counters obey what vLLM guarantees: ``prompt_tokens == prefix_cache_queries ==
sum(prompt_tokens_by_source)``, ``prompt_tokens_cached == sum(prompt_tokens_cached_by_source) ==
prefix_cache_hits + external_prefix_cache_hits``, ``request_success`` (all reasons) ==
``_count`` of every per-request histogram, ``inter_token_latency_seconds_count ==
generation_tokens - time_to_first_token_seconds_count``, and without preemptions
``iteration_tokens_total_sum == prompt_tokens_by_source{local_compute} + generation_tokens``.
Simplification: tokens recomputed after a preemption count in ``iteration_tokens_total`` but are
not queried against the prefix cache again.

``EngineMetrics`` is the recording part of :class:`~fleetscope_sim.engine.SimEngine`: the
load model (:mod:`~fleetscope_sim.engine_scheduler`) calls its hooks (``_inc``,
``_observe``, ``_count_prompt``, ``_finish``, ``_flush_step``, ``_update_gauges``), which another
engine kind overrides to record its own families (``SglangEngine``).
"""

from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING

from .hosts import EngineHost
from .ledger import Ledger, SeriesKey, Truth
from .vllm_families import FAMILIES

if TYPE_CHECKING:
    from .engine_load import SimRequest

#: Families that ``add_lazy_series`` can grow a new child in, and the existing child whose
#: increments the new one takes a share of (so sums over the family stay exact).
LAZY_SERIES_DONORS: dict[str, str] = {
    "vllm:request_success_total": "stop",
    "vllm:prompt_tokens_by_source_total": "local_compute",
    "vllm:prompt_tokens_cached_by_source_total": "device",
}


class EngineMetrics:
    """The recording part of ``SimEngine`` (a base class reading the engine's state)."""

    # set by SimEngine
    endpoint: EngineHost
    record_observations: bool
    exported: Ledger
    truth: Truth
    created: dict[tuple[str, SeriesKey], float]
    gauges: dict[str, dict[SeriesKey, float]]
    bounds: dict[str, tuple[float, ...]]
    lazy_routes: dict[str, list[tuple[str, float]]]
    sleep_state: tuple[float, float, float]
    start_wall: float
    now: float
    has_stepped: bool
    total_blocks: int
    used_blocks: int
    _rng: random.Random
    _created_seq: int
    _step_acc: list[float]
    _running: list[SimRequest]
    _waiting: deque[SimRequest]

    # -- series ------------------------------------------------------------------------------
    def _create_series(self) -> None:
        """The series a fresh engine process exports before any request (vLLM pre-creates
        every per-engine counter child and histogram; another engine kind overrides this)."""
        for spec in FAMILIES:
            if not spec.per_engine:
                continue
            if spec.kind == "counter":
                keys: list[tuple[str, ...]] = [(v,) for v in spec.label_values] or [()]
                for key in keys:
                    self.exported.ensure_counter(spec.name, key)
                    self.truth.ensure_counter(spec.name, key)
                    self._note_created(spec.name, key)
            elif spec.kind == "histogram":
                self.exported.ensure_histogram(spec.name, self.bounds[spec.name])
                self.truth.ensure_histogram(spec.name, self.bounds[spec.name])
                self._note_created(spec.name, ())

    def _note_created(self, family: str, key: SeriesKey) -> None:
        self.created[(family, key)] = self.start_wall + 1e-6 * self._created_seq
        self._created_seq += 1

    # -- recording ---------------------------------------------------------------------------
    def _inc(self, family: str, amount: float, key: SeriesKey = ()) -> None:
        routes = self.lazy_routes.get(family)
        if routes and key and key[0] == LAZY_SERIES_DONORS[family]:
            for value, share in routes:
                if amount == 1:
                    moved = 1.0 if self._rng.random() < share else 0.0
                else:
                    moved = float(round(amount * share))
                if moved:
                    amount -= moved
                    self._add(family, moved, (value,))
        if amount:
            self._add(family, amount, key)

    def _add(self, family: str, amount: float, key: SeriesKey) -> None:
        if key not in self.exported.counters.get(family, ()):
            # a series created on first use (lazy): its _created is the simulated now
            self.created[(family, key)] = self.endpoint.clock.wall_start + self.now
        self.exported.add(family, amount, key)
        self.truth.add(family, amount, key)

    def _observe(self, family: str, value: float, times: int = 1) -> None:
        self.exported.histograms[family][()].observe(value, times)
        self.truth.histograms[family][()].observe(value, times)

    _STEP_COUNTERS = (
        "vllm:generation_tokens_total",
        "vllm:estimated_flops_per_gpu_total",
        "vllm:estimated_read_bytes_per_gpu_total",
        "vllm:estimated_write_bytes_per_gpu_total",
    )

    def _flush_step(self) -> None:
        for family, amount in zip(self._STEP_COUNTERS, self._step_acc, strict=True):
            if amount:
                self._inc(family, amount)
        self._step_acc = [0.0, 0.0, 0.0, 0.0]

    def _count_prompt(self, r: SimRequest) -> None:
        prompt = r.prompt_len
        local = r.cached_local
        external = r.cached_external
        self._inc("vllm:prompt_tokens_total", prompt)
        self._inc("vllm:prefix_cache_queries_total", prompt)
        self._inc("vllm:prompt_tokens_by_source_total", r.computed, ("local_compute",))
        if local:
            self._inc("vllm:prefix_cache_hits_total", local)
            self._inc("vllm:prompt_tokens_by_source_total", local, ("local_cache_hit",))
            self._inc("vllm:prompt_tokens_cached_by_source_total", local, ("device",))
        if external:
            self._inc("vllm:external_prefix_cache_queries_total", prompt - local)
            self._inc("vllm:external_prefix_cache_hits_total", external)
            self._inc("vllm:prompt_tokens_by_source_total", external, ("external_kv_transfer",))
            self._inc("vllm:prompt_tokens_cached_by_source_total", external, ("p2p",))
        if local + external:
            self._inc("vllm:prompt_tokens_cached_total", local + external)

    def _finish(self, r: SimRequest, t: float) -> None:
        assert r.scheduled_at is not None and r.first_token_at is not None
        decode_time = t - r.first_token_at
        e2e = t - r.arrival
        obs = self._observe
        obs("vllm:e2e_request_latency_seconds", e2e)
        obs("vllm:request_queue_time_seconds", r.scheduled_at - r.arrival)
        obs("vllm:request_inference_time_seconds", t - r.scheduled_at)
        obs("vllm:request_prefill_time_seconds", r.first_token_at - r.scheduled_at)
        obs("vllm:request_decode_time_seconds", decode_time)
        obs(
            "vllm:request_time_per_output_token_seconds",
            decode_time / (r.generated - 1) if r.generated > 1 else 0.0,
        )
        obs("vllm:request_prompt_tokens", r.prompt_len)
        obs("vllm:request_generation_tokens", r.generated)
        obs("vllm:request_max_num_generation_tokens", r.generated)
        obs("vllm:request_params_n", 1)
        obs("vllm:request_params_max_tokens", r.max_tokens)
        obs("vllm:request_num_preemptions", r.preemptions)
        obs("vllm:request_prefill_kv_computed_tokens", r.computed)
        self._inc("vllm:request_success_total", 1, (r.end_reason,))
        self.used_blocks -= r.blocks
        r.blocks = 0
        self.endpoint._record_http(r.handler, r.prompt_len, r.generated, e2e)

    def _update_gauges(self) -> None:
        waiting = self._waiting
        deferred = sum(1 for r in waiting if r.ready_at > self.now)
        self.gauges = {
            "vllm:num_requests_running": {(): float(len(self._running))},
            "vllm:num_requests_waiting": {(): float(len(waiting))},
            "vllm:num_requests_waiting_by_reason": {
                ("capacity",): float(len(waiting) - deferred),
                ("deferred",): float(deferred),
            },
            "vllm:kv_cache_usage_perc": {(): self.used_blocks / self.total_blocks},
        }
        self._update_sleep_gauge()
        self.truth.gauges = {f: dict(s) for f, s in self.gauges.items()}
        if self.record_observations and self.has_stepped:
            self.truth.gauge_history.append((self.now, self.truth.gauges))

    def _update_sleep_gauge(self) -> None:
        awake, offloaded, discarded = self.sleep_state
        gauge: dict[SeriesKey, float] = {
            ("awake",): awake,
            ("weights_offloaded",): offloaded,
            ("discard_all",): discarded,
        }
        self.gauges["vllm:engine_sleep_state"] = gauge
        truth = self.truth.gauges
        if "vllm:engine_sleep_state" in truth:  # ground truth follows at once (a new dict:
            # gauge_history keeps the previous one)
            self.truth.gauges = {**truth, "vllm:engine_sleep_state": dict(gauge)}
