"""One simulated SGLang scheduler (a DP replica): the vLLM engine's load model, SGLang's metrics.

The scheduling model (arrivals, batching, paged KV, retraction on KV shortage, prefix hits) is
:class:`~fleetscope_sim.engine.SimEngine`'s; only what is recorded differs, as SGLang
0.5.23 records it:

* the **scheduler** (this replica, ``engine.exported`` / ``engine.truth``):
  ``queue_time_seconds`` (queue entry -> first forward, observed at the first forward),
  ``realtime_tokens_total{mode}`` (prefill_compute, prefill_cache at the first forward, decode
  per step), ``num_retracted_requests_total`` (a
  preemption), ``estimated_*_per_gpu_total``, and the ``log_stats`` gauges;
* the **tokenizer** (the server's API process, ``endpoint.exported`` / ``endpoint.truth``):
  TTFT at the first token; at finish ``e2e_request_latency_seconds``,
  ``request_time_per_output_token_seconds`` (finish reasons stop / length with more than one
  token), ``prompt_tokens_total`` / ``generation_tokens_total`` / ``num_requests_total``
  (labelled ``is_streaming``), ``cached_tokens_total{cache_source="device"}``, the token-length
  histograms; an aborted request counts only in ``num_aborted_requests_total``
  (``observe_one_aborted_request``); ``inter_token_latency_seconds`` per token gap.

``is_streaming`` is ``"true"`` for chat requests (the load model's handler choice). Series are
created on first use, as prometheus_client children are.
"""

from __future__ import annotations

from .engine import SimEngine
from .engine_load import SimRequest
from .ledger import SeriesKey
from .sglang_families import FAMILIES_BY_NAME

_TTFT = "sglang:time_to_first_token_seconds"
_ITL = "sglang:inter_token_latency_seconds"


def _bounds(family: str) -> tuple[float, ...]:
    return FAMILIES_BY_NAME[family].buckets


class SglangEngine(SimEngine):
    """One SGLang scheduler behind a simulated SGLang server (``dp_rank="<index>"``)."""

    # -- series ------------------------------------------------------------------------------
    def _create_series(self) -> None:
        """Nothing before the first request: SGLang's labelled children appear on first use."""
        self._ttft_key: SeriesKey = ("false",)

    def _sched_add(self, family: str, amount: float, key: SeriesKey = ()) -> None:
        if amount:
            self._add(family, amount, key)

    def _sched_observe(self, family: str, value: float, times: int = 1) -> None:
        for ledger in (self.exported, self.truth):
            ledger.observe(family, _bounds(family), value, times)

    def _tok_add(self, family: str, amount: float, key: SeriesKey = ()) -> None:
        self.endpoint._add(family, amount, key)

    def _tok_observe(self, family: str, value: float, times: int = 1, key: SeriesKey = ()) -> None:
        ep = self.endpoint
        for ledger in (ep.exported, ep.truth):
            ledger.observe(family, _bounds(family), value, times, key)

    @staticmethod
    def _streaming(r: SimRequest) -> SeriesKey:
        return ("true",) if r.handler == 1 else ("false",)

    # -- what the load model records (vLLM names in the base class) --------------------------
    def _inc(self, family: str, amount: float, key: SeriesKey = ()) -> None:
        if family == "vllm:num_preemptions_total":
            self._sched_add("sglang:num_retracted_requests_total", amount)
        # every other vLLM counter is recorded in SGLang's terms by the overrides below

    def _observe(self, family: str, value: float, times: int = 1) -> None:
        if family == "vllm:time_to_first_token_seconds":
            self._tok_observe(_TTFT, value, times, self._ttft_key)
        elif family == "vllm:inter_token_latency_seconds":
            self._tok_observe(_ITL, value, times)
        # vllm:iteration_tokens_total has no SGLang counterpart

    def _count_prompt(self, r: SimRequest) -> None:
        """The request's first forward (right before its TTFT is observed)."""
        self._ttft_key = self._streaming(r)
        assert r.scheduled_at is not None
        self._sched_observe("sglang:queue_time_seconds", r.scheduled_at - r.arrival)
        realtime = "sglang:realtime_tokens_total"
        self._sched_add(realtime, r.computed, ("prefill_compute",))
        self._sched_add(realtime, r.cached_local + r.cached_external, ("prefill_cache",))

    def _flush_step(self) -> None:
        acc = self._step_acc
        self._sched_add("sglang:realtime_tokens_total", acc[0], ("decode",))
        self._sched_add("sglang:estimated_flops_per_gpu_total", acc[1])
        self._sched_add("sglang:estimated_read_bytes_per_gpu_total", acc[2])
        self._sched_add("sglang:estimated_write_bytes_per_gpu_total", acc[3])
        self._step_acc = [0.0, 0.0, 0.0, 0.0]

    def _finish(self, r: SimRequest, t: float) -> None:
        assert r.first_token_at is not None
        self.used_blocks -= r.blocks
        r.blocks = 0
        if r.end_reason == "abort":
            self._tok_add("sglang:num_aborted_requests_total", 1)
            return
        s = self._streaming(r)
        self._tok_observe("sglang:e2e_request_latency_seconds", t - r.arrival, key=s)
        if r.generated > 1:
            tpot = (t - r.first_token_at) / (r.generated - 1)
            self._tok_observe("sglang:request_time_per_output_token_seconds", tpot, key=s)
        self._tok_add("sglang:prompt_tokens_total", r.prompt_len, s)
        self._tok_add("sglang:generation_tokens_total", r.generated, s)
        self._tok_add("sglang:num_requests_total", 1, s)
        if r.cached_local:
            self._tok_add("sglang:cached_tokens_total", r.cached_local, ("device",))
        self._tok_observe("sglang:prompt_tokens_histogram", r.prompt_len)
        self._tok_observe("sglang:generation_tokens_histogram", r.generated)

    # -- gauges --------------------------------------------------------------------------------
    def _update_gauges(self) -> None:
        block = self.load.block_size
        total = self.total_blocks * block
        used = self.used_blocks * block
        usage = used / total
        self.gauges = {
            "sglang:num_running_reqs": {(): float(len(self._running))},
            "sglang:num_queue_reqs": {(): float(len(self._waiting))},
            "sglang:token_usage": {(): round(usage, 2)},
            "sglang:full_token_usage": {(): usage},
            "sglang:num_used_tokens": {(): float(used)},
            "sglang:kv_available_tokens": {(): float(total - used)},
            "sglang:kv_used_tokens": {(): float(used)},
        }
        self.truth.gauges = {f: dict(s) for f, s in self.gauges.items()}
        if self.record_observations and self.has_stepped:
            self.truth.gauge_history.append((self.now, self.truth.gauges))

    def constants(self) -> dict[str, float]:
        """``emit_constants`` gauges: KV pool size (tokens), page size, pages, context length."""
        block = self.load.block_size
        return {
            "sglang:max_total_num_tokens": float(self.total_blocks * block),
            "sglang:page_size": float(block),
            "sglang:num_pages": float(self.total_blocks),
            "sglang:context_len": float(self.endpoint.max_model_len),
        }

    def _update_sleep_gauge(self) -> None:
        """SGLang has no sleep-state gauge."""

    def add_lazy_series(self, family: str, value: str, share: float) -> None:
        raise ValueError("lazy series are simulated for vLLM engines only")

    def change_buckets(self, family: str, bounds: tuple[float, ...]) -> None:
        raise ValueError("bucket changes are simulated for vLLM engines only")
