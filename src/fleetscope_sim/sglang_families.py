"""The SGLang 0.5.23 families the simulator's SGLang mode exposes, as plain data.

Names, types, HELP texts, labels and default bucket bounds are SGLang 0.5.23's
(``python/sglang/srt/observability/metrics_collector.py``, recorded in
``tests/data/sglang-0.5.23/families.json``); every name is a row of fleetscope's catalog
(``fleetscope.catalog.FAMILIES``, checked by the tests). Two label sets, as SGLang builds them:

* ``scheduler`` (one scheduler per DP replica): ``model_name, engine_type, tp_rank, pp_rank,
  moe_ep_rank`` and ``dp_rank`` when the server has several DP replicas;
* ``tokenizer`` (one per server, no ``dp_rank``): ``model_name, engine_type``.

SGLang always serves ``/metrics`` in prometheus multiprocess mode: no ``_created`` samples, no
``process_*`` families, histograms written ``_sum``, buckets, ``_count``; labelled children are
created on first use, so an idle server shows only its constant and ``log_stats`` gauges.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["counter", "gauge", "histogram"]
Owner = Literal["scheduler", "tokenizer"]

#: the version a simulated SGLang server reports (``/server_info`` ``version``)
SGLANG_VERSION = "0.5.23"


class SglangFamily(NamedTuple):
    """One SGLang family: exposed name (counters with ``_total``), type, HELP text, owner
    (which label set), the extra breakdown label (``is_streaming``, ``mode``...) and a
    histogram's finite bucket bounds."""

    name: str
    kind: Kind
    help: str
    owner: Owner
    label: str | None = None
    buckets: tuple[float, ...] = ()


QUEUE_TIME_BUCKETS: tuple[float, ...] = (
    0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0,
    800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0,
)  # fmt: skip
TTFT_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0,
)  # fmt: skip
E2E_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
    0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
TOKENS_BUCKETS: tuple[float, ...] = (
    100.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0,
    7000.0, 8000.0, 9000.0, 10000.0, 12500.0, 15000.0, 17500.0, 20000.0, 22500.0, 25000.0,
    27500.0, 30000.0, 35000.0, 40000.0, 60000.0, 80000.0, 100000.0, 200000.0, 300000.0,
    400000.0, 600000.0, 800000.0, 1000000.0, 1100000.0,
)  # fmt: skip

_MFU = "(for Model FLOPs Utilization calculations)."

S: Owner = "scheduler"
T: Owner = "tokenizer"

#: scheduler histograms, tokenizer counters, scheduler counters (in the order SGLang's
#: multiprocess files are read for a unified server)
HISTOGRAMS_SCHEDULER: tuple[SglangFamily, ...] = (
    SglangFamily(
        "sglang:queue_time_seconds",
        "histogram",
        "Histogram of queueing time in seconds.",
        S,
        buckets=QUEUE_TIME_BUCKETS,
    ),
)
COUNTERS_TOKENIZER: tuple[SglangFamily, ...] = (
    SglangFamily(
        "sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", T,
        "is_streaming",
    ),
    SglangFamily(
        "sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", T,
        "is_streaming",
    ),
    SglangFamily(
        "sglang:cached_tokens_total",
        "counter",
        "Number of cached prompt tokens by source (device/host/storage).",
        T,
        "cache_source",
    ),
    SglangFamily(
        "sglang:num_requests_total", "counter", "Number of requests processed.", T,
        "is_streaming",
    ),
    SglangFamily("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", T),
)  # fmt: skip
COUNTERS_SCHEDULER: tuple[SglangFamily, ...] = (
    SglangFamily(
        "sglang:realtime_tokens_total",
        "counter",
        "Total number of tokens processed (updated on each log interval). mode: prefill_compute,"
        " prefill_cache, decode.",
        S,
        "mode",
    ),
    SglangFamily(
        "sglang:num_retracted_requests_total", "counter", "Total number of retracted requests.", S
    ),
    SglangFamily(
        "sglang:estimated_flops_per_gpu_total",
        "counter",
        f"Estimated number of floating point operations per GPU {_MFU}",
        S,
    ),
    SglangFamily(
        "sglang:estimated_read_bytes_per_gpu_total",
        "counter",
        f"Estimated number of bytes read from memory per GPU {_MFU}",
        S,
    ),
    SglangFamily(
        "sglang:estimated_write_bytes_per_gpu_total",
        "counter",
        f"Estimated number of bytes written to memory per GPU {_MFU}",
        S,
    ),
)
#: emitted once at start-up (``emit_constants``): present from the first scrape
GAUGES_CONSTANT: tuple[SglangFamily, ...] = (
    SglangFamily(
        "sglang:max_total_num_tokens",
        "gauge",
        "Maximum total number of tokens in the KV cache pool.",
        S,
    ),
    SglangFamily("sglang:page_size", "gauge", "KV cache page size in tokens.", S),
    SglangFamily("sglang:num_pages", "gauge", "Number of KV cache pages.", S),
    SglangFamily("sglang:context_len", "gauge", "Maximum context length.", S),
)
#: set by the scheduler's ``log_stats`` (absent until the replica's first step)
GAUGES_LOG_STATS: tuple[SglangFamily, ...] = (
    SglangFamily("sglang:num_running_reqs", "gauge", "The number of running requests.", S),
    SglangFamily(
        "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", S
    ),
    SglangFamily("sglang:token_usage", "gauge", "The token usage.", S),
    SglangFamily(
        "sglang:full_token_usage", "gauge", "The token usage for full attention layers.", S
    ),
    SglangFamily("sglang:num_used_tokens", "gauge", "The number of used tokens.", S),
    SglangFamily(
        "sglang:kv_available_tokens",
        "gauge",
        "Number of free token slots in the KV cache pool.",
        S,
    ),
    SglangFamily(
        "sglang:kv_used_tokens",
        "gauge",
        "Number of actively used token slots in the KV cache pool.",
        S,
    ),
)
HISTOGRAMS_TOKENIZER: tuple[SglangFamily, ...] = (
    SglangFamily(
        "sglang:time_to_first_token_seconds",
        "histogram",
        "Histogram of time to first token in seconds.",
        T,
        "is_streaming",
        TTFT_BUCKETS,
    ),
    SglangFamily(
        "sglang:inter_token_latency_seconds",
        "histogram",
        "Histogram of inter-token latency in seconds.",
        T,
        buckets=ITL_BUCKETS,
    ),
    SglangFamily(
        "sglang:e2e_request_latency_seconds",
        "histogram",
        "Histogram of End-to-end request latency in seconds",
        T,
        "is_streaming",
        E2E_BUCKETS,
    ),
    SglangFamily(
        "sglang:request_time_per_output_token_seconds",
        "histogram",
        "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens"
        " - 1).",
        T,
        "is_streaming",
        ITL_BUCKETS,
    ),
    SglangFamily(
        "sglang:prompt_tokens_histogram",
        "histogram",
        "Histogram of prompt token length.",
        T,
        buckets=TOKENS_BUCKETS,
    ),
    SglangFamily(
        "sglang:generation_tokens_histogram",
        "histogram",
        "Histogram of generation token length.",
        T,
        buckets=TOKENS_BUCKETS,
    ),
)

#: every family in body order
FAMILIES: tuple[SglangFamily, ...] = (
    *HISTOGRAMS_SCHEDULER,
    *COUNTERS_TOKENIZER,
    *COUNTERS_SCHEDULER,
    *GAUGES_CONSTANT,
    *GAUGES_LOG_STATS,
    *HISTOGRAMS_TOKENIZER,
)
FAMILIES_BY_NAME: dict[str, SglangFamily] = {f.name: f for f in FAMILIES}
