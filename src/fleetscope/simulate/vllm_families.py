"""The catalogue of metric families a vLLM 0.32 API server exposes, as plain data.

Everything here was read off real ``/metrics`` bodies of vLLM 0.32.0
(``fixtures/vllm-0.32.0-cpu/``): family names exactly as exposed (counters with their
``_total`` suffix, histograms by their base name -- note ``vllm:iteration_tokens_total`` is a
*histogram*), HELP texts byte for byte (the ``http_*`` ones end with a space), types, label names,
the label values vLLM pre-creates, and histogram bucket bounds.

``FAMILIES`` lists the ``vllm:`` families in the order a single-process server writes them.
``PROCESS_FAMILIES`` (``python_*`` / ``process_*``, written first, only in normal mode) and
``HTTP_FAMILIES`` (prometheus-fastapi-instrumentator's, written last) complete the body.

In prometheus multiprocess mode (``--data-parallel-size > 1``) the same families appear grouped by
type (counters, gauges, summaries, histograms, each group in this order), without ``_created``
samples and without the process families; the gauges marked ``set_each_step`` have no sample
until the engine's first step.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["counter", "gauge", "histogram", "summary"]

#: Bucket-layout marker: 1-2-5 steps up to the server's ``max_model_len`` (vLLM's
#: ``build_1_2_5_buckets(max_model_len)``); 512 gives ``1, 2, 5, ..., 200, 500``.
MAX_MODEL_LEN_BUCKETS = "1-2-5 up to max_model_len"


class FamilySpec(NamedTuple):
    """One metric family as vLLM exposes it.

    Attributes:
        name: the name on the ``# TYPE`` line (counters keep ``_total``).
        kind: ``counter``, ``gauge``, ``histogram`` or ``summary``.
        help: the HELP text, exactly.
        label: the one breakdown label besides ``engine``/``model_name`` (``finished_reason``,
            ``source``...), or ``None``.
        label_values: the values vLLM creates for ``label`` at start-up, in exposition order.
        per_engine: whether the family carries the ``engine`` label (``admission_rejections``
            is per API server, not per engine).
        buckets: finite bucket bounds of a histogram, or ``MAX_MODEL_LEN_BUCKETS``.
        set_each_step: gauge written by the per-step stats logger (absent in multiprocess mode
            until the engine's first step).
    """

    name: str
    kind: Kind
    help: str
    label: str | None = None
    label_values: tuple[str, ...] = ()
    per_engine: bool = True
    buckets: tuple[float, ...] | str = ()
    set_each_step: bool = False


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
HTTP_HIGHR_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
    7.5, 10.0, 30.0, 60.0,
)  # fmt: skip
HTTP_DURATION_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1.0)

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

#: Order of family types in a multiprocess-mode body.
MULTIPROCESS_KIND_ORDER: dict[str, int] = {"counter": 0, "gauge": 1, "summary": 2, "histogram": 3}


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... while ``<= max_value``.

    >>> build_1_2_5_buckets(512)
    (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
    """
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


def bucket_bounds(spec: FamilySpec, max_model_len: int) -> tuple[float, ...]:
    """The finite bucket bounds of histogram ``spec`` on a server with ``max_model_len``."""
    if spec.buckets == MAX_MODEL_LEN_BUCKETS:
        return build_1_2_5_buckets(max_model_len)
    assert isinstance(spec.buckets, tuple)
    return spec.buckets
