"""The catalogue of ``vllm:`` metric families a vLLM 0.32 API server exposes, as plain data.

Everything here was read off real ``/metrics`` bodies of vLLM 0.32.0
(``fixtures/vllm-0.32.0-cpu/``): family names exactly as exposed (counters with their
``_total`` suffix, histograms by their base name -- note ``vllm:iteration_tokens_total`` is a
*histogram*), HELP texts byte for byte, types, label names, the label values vLLM pre-creates,
and histogram bucket bounds.

``FAMILIES`` lists the ``vllm:`` families in the order a single-process server writes them.
``PROCESS_FAMILIES`` (``python_*`` / ``process_*``, written first, only in normal mode) and
``HTTP_FAMILIES`` (prometheus-fastapi-instrumentator's, written last) complete the body: they
live in :mod:`~fleetscope_sim.vllm_server_families`; ``FamilySpec`` and the bucket helpers
in :mod:`~fleetscope_sim.family_spec` (all re-exported here).

In prometheus multiprocess mode (``--data-parallel-size > 1``) the same families appear grouped by
type (counters, gauges, summaries, histograms, each group in this order), without ``_created``
samples and without the process families; the gauges marked ``set_each_step`` have no sample
until the engine's first step.
"""

from __future__ import annotations

from .family_spec import (
    MAX_MODEL_LEN_BUCKETS,
    MULTIPROCESS_KIND_ORDER,
    FamilySpec,
    Kind,
    bucket_bounds,
    build_1_2_5_buckets,
)
from .vllm_server_families import (
    HTTP_DURATION_BUCKETS,
    HTTP_FAMILIES,
    HTTP_HANDLERS,
    HTTP_HIGHR_BUCKETS,
    HTTP_LABEL_NAMES,
    PROCESS_FAMILIES,
    PYTHON_INFO_LABELS,
)

__all__ = [
    "CACHE_CONFIG_INFO_LABELS",
    "FAMILIES",
    "FAMILIES_BY_NAME",
    "HTTP_DURATION_BUCKETS",
    "HTTP_FAMILIES",
    "HTTP_HANDLERS",
    "HTTP_HIGHR_BUCKETS",
    "HTTP_LABEL_NAMES",
    "ITERATION_TOKENS_BUCKETS",
    "MAX_MODEL_LEN_BUCKETS",
    "MULTIPROCESS_KIND_ORDER",
    "NUM_PREEMPTIONS_BUCKETS",
    "PROCESS_FAMILIES",
    "PYTHON_INFO_LABELS",
    "REQUEST_LATENCY_BUCKETS",
    "REQUEST_PARAMS_N_BUCKETS",
    "TOKEN_LATENCY_BUCKETS",
    "TTFT_BUCKETS",
    "FamilySpec",
    "Kind",
    "bucket_bounds",
    "build_1_2_5_buckets",
]

# Bucket layouts seen in vLLM 0.32.
ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
)  # fmt: skip
REQUEST_PARAMS_N_BUCKETS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 20.0)
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
NUM_PREEMPTIONS_BUCKETS: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)

_MFU = "(for Model Flops Utilization calculations)."
_REQ_PHASE = "Histogram of time spent in {} phase for request."

FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec(
        "vllm:estimated_flops_per_gpu_total",
        "counter",
        f"Estimated number of floating point operations per GPU {_MFU}",
    ),
    FamilySpec(
        "vllm:estimated_read_bytes_per_gpu_total",
        "counter",
        f"Estimated number of bytes read from memory per GPU {_MFU}",
    ),
    FamilySpec(
        "vllm:estimated_write_bytes_per_gpu_total",
        "counter",
        f"Estimated number of bytes written to memory per GPU {_MFU}",
    ),
    FamilySpec(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        set_each_step=True,
    ),
    FamilySpec(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        set_each_step=True,
    ),
    FamilySpec(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling"
        " capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer,"
        " blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        label="reason",
        label_values=("capacity", "deferred"),
        set_each_step=True,
    ),
    FamilySpec(
        "vllm:engine_sleep_state",
        "gauge",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake;"
        " weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        label="sleep_state",
        label_values=("awake", "weights_offloaded", "discard_all"),
    ),
    FamilySpec(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        set_each_step=True,
    ),
    FamilySpec(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    FamilySpec(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
    FamilySpec(
        "vllm:external_prefix_cache_queries_total",
        "counter",
        "External prefix cache queries from KV connector cross-instance cache sharing, in terms"
        " of number of queried tokens.",
    ),
    FamilySpec(
        "vllm:external_prefix_cache_hits_total",
        "counter",
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms of"
        " number of cached tokens.",
    ),
    FamilySpec(
        "vllm:mm_cache_queries_total",
        "counter",
        "Multi-modal cache queries, in terms of number of queried items.",
    ),
    FamilySpec(
        "vllm:mm_cache_hits_total",
        "counter",
        "Multi-modal cache hits, in terms of number of cached items.",
    ),
    FamilySpec(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
    ),
    FamilySpec("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    FamilySpec(
        "vllm:prompt_tokens_by_source_total",
        "counter",
        "Number of prompt tokens by source.",
        label="source",
        label_values=("local_compute", "local_cache_hit", "external_kv_transfer"),
    ),
    FamilySpec(
        "vllm:prompt_tokens_cached_total",
        "counter",
        "Number of cached prompt tokens (local + external).",
    ),
    FamilySpec(
        "vllm:prompt_tokens_cached_by_source_total",
        "counter",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host"
        " (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or"
        " external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits +"
        " vllm:external_prefix_cache_hits.",
        label="source",
        label_values=("device", "host", "p2p", "disk", "external_unspecified"),
    ),
    FamilySpec("vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
    FamilySpec(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        label="finished_reason",
        label_values=("stop", "length", "abort", "error", "repetition"),
    ),
    FamilySpec(
        "vllm:admission_rejections_total",
        "counter",
        "Number of admission attempts rejected by a queue limit, by reason.",
        label="reason",
        label_values=("max_num_queued_reqs", "max_num_queued_tokens"),
        per_engine=False,
    ),
    FamilySpec(
        "vllm:request_prompt_tokens",
        "histogram",
        "Number of prefill tokens processed.",
        buckets=MAX_MODEL_LEN_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_generation_tokens",
        "histogram",
        "Number of generation tokens processed.",
        buckets=MAX_MODEL_LEN_BUCKETS,
    ),
    FamilySpec(
        "vllm:iteration_tokens_total",
        "histogram",
        "Histogram of number of tokens per engine_step.",
        buckets=ITERATION_TOKENS_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_max_num_generation_tokens",
        "histogram",
        "Histogram of maximum number of requested generation tokens.",
        buckets=MAX_MODEL_LEN_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_params_n",
        "histogram",
        "Histogram of the n request parameter.",
        buckets=REQUEST_PARAMS_N_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_params_max_tokens",
        "histogram",
        "Histogram of the max_tokens request parameter.",
        buckets=MAX_MODEL_LEN_BUCKETS,
    ),
    FamilySpec(
        "vllm:time_to_first_token_seconds",
        "histogram",
        "Histogram of time to first token in seconds.",
        buckets=TTFT_BUCKETS,
    ),
    FamilySpec(
        "vllm:inter_token_latency_seconds",
        "histogram",
        "Histogram of inter-token latency in seconds.",
        buckets=TOKEN_LATENCY_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_time_per_output_token_seconds",
        "histogram",
        "Histogram of time_per_output_token_seconds per request.",
        buckets=TOKEN_LATENCY_BUCKETS,
    ),
    FamilySpec(
        "vllm:e2e_request_latency_seconds",
        "histogram",
        "Histogram of e2e request latency in seconds.",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_queue_time_seconds",
        "histogram",
        _REQ_PHASE.format("WAITING"),
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_inference_time_seconds",
        "histogram",
        _REQ_PHASE.format("RUNNING"),
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_prefill_time_seconds",
        "histogram",
        _REQ_PHASE.format("PREFILL"),
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_decode_time_seconds",
        "histogram",
        _REQ_PHASE.format("DECODE"),
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_num_preemptions",
        "histogram",
        "Histogram of the number of times a request was preempted.",
        buckets=NUM_PREEMPTIONS_BUCKETS,
    ),
    FamilySpec(
        "vllm:request_prefill_kv_computed_tokens",
        "histogram",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        buckets=MAX_MODEL_LEN_BUCKETS,
    ),
    FamilySpec(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
    ),
)

#: ``vllm:`` families by name.
FAMILIES_BY_NAME: dict[str, FamilySpec] = {f.name: f for f in FAMILIES}

#: ``vllm:cache_config_info`` labels of vLLM 0.32 with the fixture's values (as strings, the way
#: vLLM writes them). ``block_size``, ``num_gpu_blocks``, ``kv_cache_size_tokens``,
#: ``kv_cache_max_concurrency``, ``effective_attention_block_size`` and
#: ``kv_cache_memory_bytes`` are overridden per endpoint by the simulator.
CACHE_CONFIG_INFO_LABELS: dict[str, str] = {
    "_block_size_resolved": "True",
    "block_size": "128",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "128",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "1024.0",
    "kv_cache_memory_bytes": "1073741824",
    "kv_cache_size_tokens": "524288",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "4096",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}
