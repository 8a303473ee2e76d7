"""Everything fleetscope knows about vLLM's and SGLang's metric families, in one place.

:data:`FAMILIES` is the table: every family of vLLM 0.32/0.33 and SGLang 0.5.23 (plus the older
names fleetscope maps), with its type, unit, labels, the labels kept as breakdowns, and the
vLLM 0.32 name it maps to. The parser's renames (:func:`canonical_family`), the per-family
breakdowns, which labels name an engine, Ray's rewriting, the families the collector reads for
admission control and role discovery, the derived ratios and how per-engine metric names are
formed are all read from here. The parser, the statistics, the view and the health checks read
these tables; no other module spells an engine's family name. docs/sglang.md explains the SGLang
rows (what each gauge measures, tp/dp handling, what is not mapped and why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Labels = tuple[tuple[str, str], ...]

# --------------------------------------------------------------------------- the family table

#: label roles (:meth:`Family.label_roles`)
IDENTITY, RANK, BREAKDOWN, SUMMED = "identity", "rank", "breakdown", "summed"


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as an engine exposes it.

    ``name``: the exposed base name (counters without ``_total``). ``canonical``: the vLLM 0.32
    name it is parsed as (None: kept under its own name). ``rename``: an older name of the
    canonical family; dropped when the body also has the canonical one (vLLM renames, SGLang
    0.5.x renames). ``fallback``: like ``rename``, but when the canonical family is present this
    one is kept under its own name (``sglang:token_usage``, superseded by ``full_token_usage``).
    ``first``/``last``: the first/last version known to define it (None: not checked).
    ``labels``: its labels, space separated; ``breakdown``: those kept apart per engine (the
    others are identity, repeated ranks counted once, or summed: :meth:`label_roles`).
    ``evidence``: where the mapping or the role comes from.
    """

    name: str
    engine: str  # "vllm" | "sglang"
    type: str  # counter | gauge | histogram | summary
    unit: str
    canonical: str | None = None
    rename: bool = False
    fallback: bool = False
    deprecated: bool = False
    first: str | None = None
    last: str | None = None
    labels: str = ""
    breakdown: str = ""
    evidence: str = ""

    @property
    def parsed_name(self) -> str:
        """The family name the parser files its samples under."""
        return self.canonical or self.name

    def label_roles(self) -> dict[str, str]:
        """label -> identity | rank (repeats counted once) | breakdown | summed."""
        kept = set(self.breakdown.split())
        ident = VLLM_IDENTITY_LABELS if self.engine == "vllm" else SGLANG_IDENTITY_LABELS
        out = {}
        for label in self.labels.split():
            if label in ident:
                out[label] = IDENTITY
            elif self.engine == "sglang" and label in SGLANG_RANK_LABELS:
                out[label] = RANK
            elif label in kept:
                out[label] = BREAKDOWN
            else:
                out[label] = SUMMED
        return out


# SGLang label sets (tests/data/sglang-0.5.23/README.md): scheduler, tokenizer, radix cache,
# storage; vLLM's base labels
S = "model_name engine_type tp_rank pp_rank moe_ep_rank priority dp_rank"
T = "model_name engine_type priority"
R = "cache_type tp_rank pp_rank dp_rank"
ST = "storage_backend tp_rank dp_rank pp_rank"
B = "model_name engine"

_SG_SOURCE = "SGLang 0.5.23 metrics_collector.py (tests/data/sglang-0.5.23/families.json)"
_VL_SOURCE = "vLLM 0.32.0/0.33.0 source (tests/data/vllm-families/families.json)"
_SAME = "same name, type and unit; same meaning (tests/data/sglang-0.5.23/README.md mapping table)"


def _sg(name: str, type: str, unit: str, **kw: Any) -> Family:
    kw.setdefault("evidence", _SAME if kw.get("canonical") else _SG_SOURCE)
    return Family(name, "sglang", type, unit, **kw)


def _vl(name: str, type: str, unit: str, **kw: Any) -> Family:
    kw.setdefault("evidence", _VL_SOURCE)
    return Family(name, "vllm", type, unit, **kw)


FAMILIES: tuple[Family, ...] = (
    # ---- older names (renames across versions)
    _vl(
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "ratio 0-1",
        canonical="vllm:kv_cache_usage_perc",
        rename=True,
        labels=B,
        evidence="vLLM V0 name",
    ),
    _vl(
        "vllm:gpu_prefix_cache_queries",
        "counter",
        "",
        canonical="vllm:prefix_cache_queries",
        rename=True,
        labels=B,
        evidence="vLLM V0 name",
    ),
    _vl(
        "vllm:gpu_prefix_cache_hits",
        "counter",
        "",
        canonical="vllm:prefix_cache_hits",
        rename=True,
        labels=B,
        evidence="vLLM V0 name",
    ),
    _vl(
        "vllm:time_per_output_token_seconds",
        "histogram",
        "seconds",
        canonical="vllm:inter_token_latency_seconds",
        rename=True,
        labels=B,
        evidence="vLLM V0's per-token latency histogram; V1 calls it inter-token latency",
    ),
    _sg(
        "sglang:num_prefill_infight_queue_reqs",
        "gauge",
        "requests",
        canonical="sglang:num_prefill_inflight_queue_reqs",
        rename=True,
        last="0.5.1",
        labels=S,
        evidence="typo up to 0.5.1 (checked 0.4.10.post2, 0.5.1), renamed in 0.5.2",
    ),
    _sg(
        "sglang:queue_time_s",
        "histogram",
        "seconds",
        canonical="vllm:request_queue_time_seconds",
        rename=True,
        first="0.5.2",
        labels=S,
        evidence="0.5.2 histogram of the same wait (queue entry -> first forward), other buckets; "
        "queue_time_seconds by 0.5.23",
    ),
    _sg(
        "sglang:avg_request_queue_latency",
        "gauge",
        "seconds",
        last="0.5.2",
        labels=S,
        evidence="a last-interval average gauge (0.5.1, 0.5.2): never merged into the histogram",
    ),
    _sg(
        "sglang:total_retracted_reqs",
        "gauge",
        "requests",
        last="0.5.2",
        labels=S,
        evidence="0.5.2 gauge; 0.5.23 has the counter num_retracted_requests_total",
    ),
    _sg("sglang:num_prefill_prealloc_queue_reqs", "gauge", "requests", last="0.5.2", labels=S),
    _sg("sglang:num_running_reqs_offline_batch", "gauge", "requests", last="0.5.2", labels=S),
    _sg(
        "sglang:time_to_first_token_seconds_offline_batch",
        "histogram",
        "seconds",
        last="0.5.2",
        labels=T,
    ),
    _sg("sglang:engine_startup_time", "gauge", "seconds", last="0.5.2", labels=T),
    _sg("sglang:engine_load_weights_time", "gauge", "seconds", last="0.5.2", labels=T),
    # ---- current families (generated from the families.json files, then reviewed)
    _sg("sglang:backup_bandwidth", "histogram", "", labels=ST),
    _sg("sglang:backup_pgs", "histogram", "", labels=ST),
    _sg("sglang:backuped_tokens", "counter", "tokens", labels=ST),
    _sg("sglang:cache_hit_rate", "gauge", "ratio", labels=S),
    _sg(
        "sglang:cached_tokens",
        "counter",
        "tokens",
        labels=T + " cache_source",
        breakdown="cache_source",
    ),
    _sg("sglang:context_len", "gauge", "", labels=S),
    _sg("sglang:cuda_graph_passes", "counter", "", labels=S + " mode", breakdown="mode"),
    _sg("sglang:decode_deferred_kv_release_seconds", "histogram", "seconds", labels=S),
    _sg(
        "sglang:decode_deferred_kv_release",
        "counter",
        "",
        labels=S + " outcome",
        breakdown="outcome",
    ),
    _sg("sglang:decode_sum_seq_lens", "gauge", "", labels=S),
    _sg("sglang:dp_attention_pairs", "counter", "", labels=S + " kind", breakdown="kind"),
    _sg(
        "sglang:dp_attention_steps", "counter", "", labels=S + " rank_state", breakdown="rank_state"
    ),
    _sg("sglang:dp_attention_sync_wait_seconds", "histogram", "seconds", labels=S),
    _sg("sglang:dp_attention_token_imbalance_ratio", "histogram", "ratio", labels=S),
    _sg("sglang:dp_attention_tokens", "counter", "tokens", labels=S + " kind", breakdown="kind"),
    _sg(
        "sglang:dp_cooperation_forward_execution_seconds",
        "counter",
        "seconds",
        labels=S + " category num_prefill_ranks",
        breakdown="category num_prefill_ranks",
    ),
    _sg(
        "sglang:dp_cooperation_realtime_tokens",
        "counter",
        "ratio",
        labels=S + " mode num_prefill_ranks",
        breakdown="mode num_prefill_ranks",
    ),
    _sg(
        "sglang:e2e_request_latency_seconds",
        "histogram",
        "seconds",
        canonical="vllm:e2e_request_latency_seconds",
        labels=T + " is_streaming",
    ),
    _sg("sglang:encoder_cache_entries", "gauge", "", labels="model_name"),
    _sg(
        "sglang:encoder_cache_evictions",
        "counter",
        "",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_cache_hit_files",
        "counter",
        "",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_cache_hit_tokens",
        "counter",
        "tokens",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg("sglang:encoder_cache_size_mb", "gauge", "MB", labels="model_name"),
    _sg(
        "sglang:encoder_cache_total_files",
        "counter",
        "",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_cache_total_tokens",
        "counter",
        "tokens",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg("sglang:encoder_dp_pending_requests", "gauge", "requests", labels="dp_rank"),
    _sg(
        "sglang:encoder_mm_items_per_batch",
        "histogram",
        "",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_mm_items_per_request",
        "histogram",
        "",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_model_forward_seconds",
        "histogram",
        "seconds",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_preprocess_seconds",
        "histogram",
        "seconds",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_queue_wait_seconds",
        "histogram",
        "seconds",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_request_e2e_latency_seconds",
        "histogram",
        "seconds",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_requests_received",
        "counter",
        "requests",
        labels="model_name modality",
        breakdown="modality",
    ),
    _sg(
        "sglang:encoder_requests",
        "counter",
        "requests",
        labels="model_name modality status",
        breakdown="modality status",
    ),
    _sg(
        "sglang:encoder_transfer_seconds",
        "histogram",
        "seconds",
        labels="model_name backend",
        breakdown="backend",
    ),
    _sg(
        "sglang:eplb_balancedness",
        "summary",
        "",
        labels=S + " forward_mode",
        breakdown="forward_mode",
    ),
    _sg("sglang:eplb_gpu_physical_count", "histogram", "", labels="layer"),
    _sg(
        "sglang:estimated_flops_per_gpu",
        "counter",
        "",
        canonical="vllm:estimated_flops_per_gpu",
        evidence="same name and meaning (MFU, only with --enable-mfu-metrics)",
        labels=S,
    ),
    _sg(
        "sglang:estimated_read_bytes_per_gpu",
        "counter",
        "bytes",
        canonical="vllm:estimated_read_bytes_per_gpu",
        evidence="same name and meaning (MFU, only with --enable-mfu-metrics)",
        labels=S,
    ),
    _sg(
        "sglang:estimated_write_bytes_per_gpu",
        "counter",
        "bytes",
        canonical="vllm:estimated_write_bytes_per_gpu",
        evidence="same name and meaning (MFU, only with --enable-mfu-metrics)",
        labels=S,
    ),
    _sg("sglang:evicted_tokens", "counter", "tokens", labels=R),
    _sg("sglang:eviction_duration_seconds", "histogram", "seconds", labels=R),
    _sg(
        "sglang:forward_execution_seconds",
        "counter",
        "seconds",
        labels=S + " category",
        breakdown="category",
    ),
    _sg(
        "sglang:full_token_usage",
        "gauge",
        "ratio",
        canonical="vllm:kv_cache_usage_perc",
        evidence="(total - available - evictable) / total of the full-attention KV pool, "
        "unrounded: vLLM's kv_cache_usage_perc (evictable prefix cache counted free in both)",
        labels=S,
    ),
    _sg("sglang:func_latency_seconds", "histogram", "seconds", labels="name", breakdown="name"),
    _sg("sglang:fwd_occupancy", "gauge", "ratio", labels=S),
    _sg("sglang:gen_throughput", "gauge", "", labels=S),
    _sg("sglang:generation_tokens_histogram", "histogram", "ratio", labels=T),
    _sg(
        "sglang:generation_tokens",
        "counter",
        "tokens",
        canonical="vllm:generation_tokens",
        evidence="same unit and meaning; SGLang counts at finish (tokenizer)",
        labels=T + " is_streaming",
    ),
    _sg("sglang:get_loads_duration_seconds", "histogram", "seconds", labels=T),
    _sg("sglang:grammar_compilation_time_seconds", "histogram", "seconds", labels=S),
    _sg("sglang:grammar_ebnf_size", "histogram", "", labels=S),
    _sg("sglang:grammar_schema_count", "histogram", "", labels=S),
    _sg("sglang:grammar_tree_traversal_time_avg", "histogram", "", labels=S),
    _sg("sglang:grammar_tree_traversal_time_max", "histogram", "", labels=S),
    _sg("sglang:graph_memory_usage_gb", "gauge", "GB", labels=S + " phase", breakdown="phase"),
    _sg("sglang:hicache_backup_bytes", "counter", "bytes", labels=R),
    _sg("sglang:hicache_backup_dropped_tokens", "counter", "tokens", labels=ST),
    _sg("sglang:hicache_backup_duration_seconds", "histogram", "seconds", labels=R),
    _sg("sglang:hicache_backup_tokens", "counter", "tokens", labels=R + " pool", breakdown="pool"),
    _sg(
        "sglang:hicache_dropped_tokens",
        "counter",
        "tokens",
        labels=R + " reason pool",
        breakdown="reason pool",
    ),
    _sg("sglang:hicache_host_mamba_total_states", "gauge", "", labels=S),
    _sg("sglang:hicache_host_mamba_used_states", "gauge", "", labels=S),
    _sg("sglang:hicache_host_total_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:hicache_host_used_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:hicache_prefetch_aux_alloc_failed_tokens", "counter", "tokens", labels=ST),
    _sg(
        "sglang:http_requests_active",
        "gauge",
        "requests",
        labels="endpoint method",
        breakdown="endpoint method",
    ),
    _sg(
        "sglang:http_requests",
        "counter",
        "requests",
        labels="endpoint method",
        breakdown="endpoint method",
    ),
    _sg(
        "sglang:http_responses",
        "counter",
        "",
        labels="endpoint status_code method",
        breakdown="endpoint status_code method",
    ),
    _sg(
        "sglang:inter_token_latency_seconds",
        "histogram",
        "seconds",
        evidence="not mapped: _count is per token (a chunk's interval split over its n tokens), "
        "vLLM's per engine step",
        labels=T,
    ),
    _sg("sglang:is_cuda_graph", "gauge", "", labels=S),
    _sg("sglang:kv_available_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:kv_cache_memory_usage_gb", "gauge", "GB", labels=S),
    _sg("sglang:kv_evictable_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:kv_transfer_alloc_ms", "histogram", "ms", labels=S),
    _sg("sglang:kv_transfer_bootstrap_ms", "histogram", "ms", labels=S),
    _sg("sglang:kv_transfer_latency_ms", "histogram", "ms", labels=S),
    _sg("sglang:kv_transfer_speed_gb_s", "histogram", "GB/s", labels=S),
    _sg("sglang:kv_transfer_total_mb", "histogram", "MB", labels=S),
    _sg("sglang:kv_used_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:load_back_bytes", "counter", "bytes", labels=R),
    _sg("sglang:load_back_duration_seconds", "histogram", "seconds", labels=R),
    _sg("sglang:load_back_tokens", "counter", "tokens", labels=R + " pool", breakdown="pool"),
    _sg("sglang:lora_pool_slots_total", "gauge", "", labels=S),
    _sg("sglang:lora_pool_slots_used", "gauge", "", labels=S),
    _sg("sglang:lora_pool_utilization", "gauge", "ratio", labels=S),
    _sg("sglang:mamba_available_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:mamba_evictable_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:mamba_usage", "gauge", "ratio", labels=S),
    _sg("sglang:mamba_used_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:max_running_requests_under_SLO", "gauge", "requests", labels=S),
    _sg("sglang:max_total_num_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:max_total_num_tokens_swa", "gauge", "tokens", labels=S),
    _sg("sglang:new_token_ratio", "gauge", "ratio", labels=S),
    _sg("sglang:num_aborted_requests", "counter", "requests", labels=T),
    _sg("sglang:num_bootstrap_failed_reqs", "counter", "requests", labels=S),
    _sg("sglang:num_decode_deferred_kv_release_reqs", "gauge", "requests", labels=S),
    _sg("sglang:num_decode_host_receive_queue_reqs", "gauge", "requests", labels=S),
    _sg("sglang:num_decode_host_receive_reqs", "counter", "requests", labels=S),
    _sg("sglang:num_decode_prealloc_queue_reqs", "gauge", "requests", labels=S),
    _sg("sglang:num_decode_transfer_queue_reqs", "gauge", "requests", labels=S),
    _sg("sglang:num_grammar_aborted", "counter", "", labels=S),
    _sg("sglang:num_grammar_cache_hit", "counter", "", labels=S),
    _sg("sglang:num_grammar_queue_reqs", "gauge", "requests", labels=S),
    _sg("sglang:num_grammar_timeout", "counter", "", labels=S),
    _sg("sglang:num_grammar", "counter", "", labels=S),
    _sg("sglang:num_pages", "gauge", "", labels=S),
    _sg("sglang:num_paused_reqs", "gauge", "requests", labels=S),
    _sg("sglang:num_prefill_bootstrap_queue_reqs", "gauge", "requests", labels=S),
    _sg("sglang:num_prefill_inflight_queue_reqs", "gauge", "requests", labels=S),
    _sg("sglang:num_prefill_retries", "counter", "", labels=S),
    _sg(
        "sglang:num_queue_reqs",
        "gauge",
        "requests",
        canonical="vllm:num_requests_waiting",
        labels=S,
    ),
    _sg("sglang:num_requests", "counter", "requests", labels=T + " is_streaming"),
    _sg("sglang:num_retracted_input_tokens", "counter", "tokens", labels=S),
    _sg("sglang:num_retracted_output_tokens", "counter", "tokens", labels=S),
    _sg("sglang:num_retracted_reqs", "gauge", "requests", labels=S),
    _sg(
        "sglang:num_retracted_requests",
        "counter",
        "requests",
        canonical="vllm:num_preemptions",
        evidence="a running request evicted on KV shortage and requeued: vLLM's preemption",
        labels=S,
    ),
    _sg(
        "sglang:num_running_reqs",
        "gauge",
        "requests",
        canonical="vllm:num_requests_running",
        labels=S,
    ),
    _sg("sglang:num_so_requests", "counter", "requests", labels=T),
    _sg("sglang:num_streaming_sessions", "gauge", "", labels=S),
    _sg("sglang:num_transfer_failed_reqs", "counter", "requests", labels=S),
    _sg("sglang:num_unique_running_routing_keys", "gauge", "", labels=S),
    _sg("sglang:num_used_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:page_size", "gauge", "", labels=S),
    _sg("sglang:pending_prealloc_token_usage", "gauge", "ratio", labels=S),
    _sg(
        "sglang:per_stage_req_latency_seconds",
        "histogram",
        "seconds",
        labels=S + " stage",
        breakdown="stage",
    ),
    _sg("sglang:prealloc_full_token_usage", "gauge", "ratio", labels=S),
    _sg("sglang:prealloc_swa_token_usage", "gauge", "ratio", labels=S),
    _sg("sglang:prefetch_bandwidth", "histogram", "", labels=ST),
    _sg("sglang:prefetch_pgs", "histogram", "", labels=ST),
    _sg("sglang:prefetched_tokens", "counter", "tokens", labels=ST),
    _sg(
        "sglang:prefill_delayer_outcomes",
        "counter",
        "",
        labels=S + " input_estimation output_allow output_reason actual_execution",
        breakdown="input_estimation output_allow output_reason actual_execution",
    ),
    _sg("sglang:prefill_delayer_wait_forward_passes", "histogram", "", labels=S),
    _sg("sglang:prefill_delayer_wait_seconds", "histogram", "seconds", labels=S),
    _sg(
        "sglang:prefill_effective_tokens", "counter", "tokens", labels=S + " mode", breakdown="mode"
    ),
    _sg(
        "sglang:process_cpu_seconds",
        "counter",
        "seconds",
        labels="component",
        breakdown="component",
    ),
    _sg("sglang:prompt_tokens_histogram", "histogram", "tokens", labels=T),
    _sg(
        "sglang:prompt_tokens",
        "counter",
        "tokens",
        canonical="vllm:prompt_tokens",
        evidence="same unit and meaning; SGLang counts at finish (tokenizer), vLLM at prefill",
        labels=T + " is_streaming",
    ),
    _sg(
        "sglang:queue_time_seconds",
        "histogram",
        "seconds",
        canonical="vllm:request_queue_time_seconds",
        evidence="one sample per request, wait-queue entry -> first forward; other buckets",
        labels=S,
    ),
    _sg("sglang:realtime_tokens", "counter", "tokens", labels=S + " mode", breakdown="mode"),
    _sg(
        "sglang:request_time_per_output_token_seconds",
        "histogram",
        "seconds",
        canonical="vllm:request_time_per_output_token_seconds",
        labels=T + " is_streaming",
    ),
    _sg("sglang:routing_key_all_req_count", "gauge", "", labels=S + " gt le", breakdown="gt le"),
    _sg(
        "sglang:routing_key_running_req_count", "gauge", "", labels=S + " gt le", breakdown="gt le"
    ),
    _sg("sglang:routing_keys_active", "gauge", "", labels=""),
    _sg("sglang:scheduler_idle_seconds", "counter", "seconds", labels=S),
    _sg("sglang:scheduler_process_cpu_seconds", "counter", "seconds", labels=S),
    _sg(
        "sglang:scheduler_stage_seconds",
        "counter",
        "seconds",
        labels=S + " category forward_overlap",
        breakdown="category forward_overlap",
    ),
    _sg("sglang:spec_accept_length", "gauge", "", labels=S),
    _sg("sglang:spec_accept_rate", "gauge", "ratio", labels=S),
    _sg("sglang:spec_block_accept_length", "gauge", "", labels=S),
    _sg("sglang:spec_cap_length", "gauge", "", labels=S),
    _sg("sglang:spec_num_draft_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:spec_num_steps", "gauge", "", labels=S),
    _sg("sglang:spec_verify_calls", "counter", "", labels=T),
    _sg("sglang:startup_available_gpu_memory_gb", "gauge", "GB", labels=S),
    _sg(
        "sglang:startup_cuda_graph_time_seconds",
        "gauge",
        "seconds",
        labels=T + " phase",
        breakdown="phase",
    ),
    _sg(
        "sglang:startup_latency_breakdown_seconds_max",
        "gauge",
        "seconds",
        labels="context",
        breakdown="context",
    ),
    _sg("sglang:startup_time_seconds", "gauge", "seconds", labels=T + " phase", breakdown="phase"),
    _sg(
        "sglang:storage_prefetch_deferred_tokens",
        "counter",
        "tokens",
        labels=ST + " reason",
        breakdown="reason",
    ),
    _sg("sglang:storage_prefetch_hit_tokens", "counter", "tokens", labels=ST),
    _sg(
        "sglang:storage_prefetch_unfulfilled_tokens",
        "counter",
        "tokens",
        labels=ST + " reason",
        breakdown="reason",
    ),
    _sg("sglang:streaming_session_held_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:swa_available_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:swa_evictable_tokens", "gauge", "tokens", labels=S),
    _sg("sglang:swa_token_usage", "gauge", "ratio", labels=S),
    _sg("sglang:swa_used_tokens", "gauge", "tokens", labels=S),
    _sg(
        "sglang:time_to_first_token_seconds",
        "histogram",
        "seconds",
        canonical="vllm:time_to_first_token_seconds",
        labels=T + " is_streaming",
    ),
    _sg(
        "sglang:token_usage",
        "gauge",
        "ratio",
        canonical="vllm:kv_cache_usage_perc",
        fallback=True,
        evidence="round(max(full, swa, mamba) usage, 2): the bottleneck pool, rounded; "
        "kv_cache_usage_perc only when full_token_usage is absent (else kept "
        "as sglang:token_usage)",
        labels=S,
    ),
    _sg("sglang:uncached_prompt_tokens_histogram", "histogram", "tokens", labels=T),
    _sg("sglang:utilization", "gauge", "ratio", labels=S),
    _sg(
        "sglang:weight_load_duration_seconds",
        "gauge",
        "seconds",
        labels=S + " source",
        breakdown="source",
    ),
    _sg("sglang:weight_memory_usage_gb", "gauge", "GB", labels=S),
    _vl("vllm:admission_rejections", "counter", "", labels="model_name reason", breakdown="reason"),
    _vl("vllm:cache_config_info", "gauge", "info (value 1)", labels="engine"),
    _vl("vllm:corrupted_requests", "counter", "requests", labels=B),
    _vl("vllm:diffusion_num_canvas_positions", "counter", "", labels=B),
    _vl("vllm:diffusion_num_committed_tokens", "counter", "tokens", labels=B),
    _vl("vllm:diffusion_num_denoising_steps", "counter", "", labels=B),
    _vl("vllm:e2e_request_latency_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:engine_sleep_state", "gauge", "", labels=B + " sleep_state", breakdown="sleep_state"),
    _vl("vllm:estimated_flops_per_gpu", "counter", "", labels=B),
    _vl("vllm:estimated_read_bytes_per_gpu", "counter", "bytes", labels=B),
    _vl("vllm:estimated_write_bytes_per_gpu", "counter", "bytes", labels=B),
    _vl("vllm:external_prefix_cache_hits", "counter", "", labels=B),
    _vl("vllm:external_prefix_cache_queries", "counter", "", labels=B),
    _vl("vllm:generation_tokens", "counter", "tokens", labels=B),
    _vl("vllm:hf3fs_load_duration_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:hf3fs_num_failed_load", "counter", "", labels=B),
    _vl("vllm:hf3fs_num_failed_save", "counter", "", labels=B),
    _vl("vllm:hf3fs_save_duration_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:hisparse_cache_hits", "counter", "", labels=B),
    _vl("vllm:hisparse_cache_misses", "counter", "", labels=B),
    _vl("vllm:hisparse_host_block_idle_before_evict_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:hisparse_host_block_lifetime_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:hisparse_host_block_reuse_gap_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:hisparse_host_cache_usage_perc", "gauge", "ratio 0-1", labels=B),
    _vl("vllm:hisparse_host_to_device_bytes", "counter", "bytes", labels=B),
    _vl("vllm:hisparse_pending_page_transfers", "gauge", "", labels=B),
    _vl("vllm:inter_token_latency_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:iteration_tokens_total", "histogram", "tokens", labels=B),
    _vl("vllm:kv_block_idle_before_evict_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:kv_block_lifetime_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:kv_block_reuse_gap_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:kv_cache_usage_perc", "gauge", "ratio 0-1", labels=B),
    _vl("vllm:kv_offload_allocation_failure", "counter", "", labels=B),
    _vl("vllm:kv_offload_config_info", "gauge", "info (value 1)", first="0.33.0", labels=B),
    _vl("vllm:kv_offload_cpu_allocation_size", "histogram", "bytes", labels=B),
    _vl("vllm:kv_offload_cpu_cache_read_usage_perc", "gauge", "ratio 0-1", labels=B),
    _vl("vllm:kv_offload_cpu_cache_usage_perc", "gauge", "ratio 0-1", labels=B),
    _vl("vllm:kv_offload_cpu_cache_write_usage_perc", "gauge", "ratio 0-1", labels=B),
    _vl("vllm:kv_offload_load_bytes", "counter", "bytes", labels=B),
    _vl("vllm:kv_offload_load_size", "histogram", "bytes", labels=B),
    _vl("vllm:kv_offload_load_time", "counter", "seconds", labels=B),
    _vl("vllm:kv_offload_lookup_async_delay_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:kv_offload_lookup_sync_delay_seconds", "histogram", "seconds", labels=B),
    _vl(
        "vllm:kv_offload_size",
        "histogram",
        "bytes",
        deprecated=True,
        labels=B + " transfer_type",
        breakdown="transfer_type",
    ),
    _vl("vllm:kv_offload_store_bytes", "counter", "bytes", labels=B),
    _vl("vllm:kv_offload_store_size", "histogram", "bytes", labels=B),
    _vl("vllm:kv_offload_store_time", "counter", "seconds", labels=B),
    _vl("vllm:kv_offload_stores_skipped", "counter", "", labels=B),
    _vl("vllm:kv_offload_tiering_active_cascade_jobs", "gauge", "", labels=B + " tier"),
    _vl("vllm:kv_offload_tiering_active_promotion_jobs", "gauge", "", labels=B + " tier"),
    _vl(
        "vllm:kv_offload_tiering_backpressure_blocks_dropped",
        "counter",
        "blocks",
        labels=B + " tier",
    ),
    _vl("vllm:kv_offload_tiering_backpressure_store_latency_ema", "gauge", "", labels=B + " tier"),
    _vl("vllm:kv_offload_tiering_backpressure_stores_dropped", "counter", "", labels=B + " tier"),
    _vl("vllm:kv_offload_tiering_cascade_job_failures", "counter", "", labels=B + " tier"),
    _vl("vllm:kv_offload_tiering_chunk_hits", "counter", "", labels=B + " tier"),
    _vl("vllm:kv_offload_tiering_chunk_queries", "counter", "", labels=B + " tier"),
    _vl(
        "vllm:kv_offload_tiering_lookup_async_delay_seconds",
        "histogram",
        "seconds",
        labels=B + " tier",
    ),
    _vl(
        "vllm:kv_offload_tiering_lookup_sync_delay_seconds",
        "histogram",
        "seconds",
        labels=B + " tier",
    ),
    _vl(
        "vllm:kv_offload_tiering_primary_read_usage_perc", "gauge", "ratio 0-1", labels=B + " tier"
    ),
    _vl(
        "vllm:kv_offload_tiering_primary_write_usage_perc", "gauge", "ratio 0-1", labels=B + " tier"
    ),
    _vl("vllm:kv_offload_tiering_promotion_allocation_failures", "counter", "", labels=B),
    _vl("vllm:kv_offload_tiering_promotion_job_failures", "counter", "", labels=B + " tier"),
    _vl(
        "vllm:kv_offload_tiering_promotion_latency_seconds",
        "histogram",
        "seconds",
        first="0.33.0",
        labels=B + " tier result",
    ),
    _vl("vllm:kv_offload_tiering_read_bytes", "counter", "bytes", labels=B + " tier"),
    _vl("vllm:kv_offload_tiering_read_time", "counter", "seconds", labels=B + " tier"),
    _vl("vllm:kv_offload_tiering_write_bytes", "counter", "bytes", labels=B + " tier"),
    _vl("vllm:kv_offload_tiering_write_time", "counter", "seconds", labels=B + " tier"),
    _vl(
        "vllm:kv_offload_total_bytes",
        "counter",
        "bytes",
        deprecated=True,
        labels=B + " transfer_type",
        breakdown="transfer_type",
    ),
    _vl(
        "vllm:kv_offload_total_time",
        "counter",
        "seconds",
        deprecated=True,
        labels=B + " transfer_type",
        breakdown="transfer_type",
    ),
    _vl(
        "vllm:lora_requests_info",
        "gauge",
        "info (value 1)",
        labels="max_lora waiting_lora_adapters running_lora_adapters",
    ),
    _vl("vllm:mm_cache_hits", "counter", "", labels=B),
    _vl("vllm:mm_cache_queries", "counter", "", labels=B),
    _vl("vllm:mooncake_bytes_transferred", "histogram", "bytes", first="0.33.0", labels=B),
    _vl("vllm:mooncake_num_descriptors", "histogram", "", first="0.33.0", labels=B),
    _vl("vllm:mooncake_num_failed_recvs", "counter", "", first="0.33.0", labels=B),
    _vl("vllm:mooncake_num_failed_transfers", "counter", "", first="0.33.0", labels=B),
    _vl("vllm:mooncake_num_kv_expired_reqs", "counter", "requests", first="0.33.0", labels=B),
    _vl("vllm:mooncake_store_operation_bytes", "counter", "bytes", labels=B + " operation status"),
    _vl("vllm:mooncake_store_operation_failed_keys", "counter", "", labels=B + " operation status"),
    _vl("vllm:mooncake_store_operation_keys", "counter", "", labels=B + " operation status"),
    _vl(
        "vllm:mooncake_store_operation_time_seconds",
        "histogram",
        "seconds",
        labels=B + " operation status",
    ),
    _vl("vllm:mooncake_store_operation", "counter", "", labels=B + " operation status"),
    _vl("vllm:mooncake_xfer_time_seconds", "histogram", "seconds", first="0.33.0", labels=B),
    _vl("vllm:nixl_bytes_transferred", "histogram", "bytes", labels=B),
    _vl("vllm:nixl_num_descriptors", "histogram", "", labels=B),
    _vl("vllm:nixl_num_failed_notifications", "counter", "", labels=B),
    _vl("vllm:nixl_num_failed_transfers", "counter", "", labels=B),
    _vl("vllm:nixl_num_kv_expired_reqs", "counter", "requests", labels=B),
    _vl("vllm:nixl_num_notifications_after_expiry", "counter", "", labels=B),
    _vl("vllm:nixl_post_time_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:nixl_xfer_time_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:num_preemptions", "counter", "", labels=B),
    _vl("vllm:num_requests_kv_fetch_by_stage", "gauge", "requests", labels=B + " stage"),
    _vl("vllm:num_requests_running", "gauge", "requests", labels=B),
    _vl("vllm:num_requests_waiting", "gauge", "requests", labels=B),
    _vl(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "requests",
        labels=B + " reason",
        breakdown="reason",
    ),
    _vl("vllm:prefix_cache_hits", "counter", "", labels=B),
    _vl("vllm:prefix_cache_queries", "counter", "", labels=B),
    _vl(
        "vllm:prompt_tokens_by_source",
        "counter",
        "tokens",
        labels=B + " source",
        breakdown="source",
    ),
    _vl(
        "vllm:prompt_tokens_cached_by_source",
        "counter",
        "tokens",
        labels=B + " source",
        breakdown="source",
    ),
    _vl("vllm:prompt_tokens_cached", "counter", "tokens", labels=B),
    _vl("vllm:prompt_tokens", "counter", "tokens", labels=B),
    _vl("vllm:request_decode_time_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:request_generation_tokens", "histogram", "tokens", labels=B),
    _vl("vllm:request_inference_time_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:request_max_num_generation_tokens", "histogram", "tokens", labels=B),
    _vl("vllm:request_num_preemptions", "histogram", "", labels=B),
    _vl("vllm:request_params_max_tokens", "histogram", "tokens", labels=B),
    _vl("vllm:request_params_n", "histogram", "", labels=B),
    _vl("vllm:request_prefill_kv_computed_tokens", "histogram", "tokens", labels=B),
    _vl("vllm:request_prefill_time_seconds", "histogram", "seconds", labels=B),
    _vl("vllm:request_prompt_tokens", "histogram", "tokens", labels=B),
    _vl("vllm:request_queue_time_seconds", "histogram", "seconds", labels=B),
    _vl(
        "vllm:request_success",
        "counter",
        "",
        labels=B + " finished_reason",
        breakdown="finished_reason",
    ),
    _vl("vllm:request_time_per_output_token_seconds", "histogram", "seconds", labels=B),
    _vl(
        "vllm:rl_weight_update_operation_duration_seconds",
        "histogram",
        "seconds",
        labels="operation",
    ),
    _vl("vllm:rl_weight_update_operations_in_flight", "gauge", "", labels="operation"),
    _vl(
        "vllm:simple_kv_offload_info",
        "gauge",
        "info (value 1)",
        labels=B + " backend page_cache lazy_offload capacity_blocks",
    ),
    _vl("vllm:simple_kv_offload_load_blocks", "counter", "blocks", labels=B),
    _vl("vllm:simple_kv_offload_pending_store_blocks", "gauge", "blocks", labels=B),
    _vl("vllm:simple_kv_offload_save_outcomes", "counter", "", labels=B + " outcome"),
    _vl("vllm:simple_kv_offload_used_blocks", "gauge", "blocks", labels=B),
    _vl("vllm:sleep_mode_operation_duration_seconds", "histogram", "seconds", labels="operation"),
    _vl("vllm:sleep_mode_operations_in_flight", "gauge", "", labels="operation"),
    _vl(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "counter",
        "tokens",
        labels=B + " position",
        breakdown="position",
    ),
    _vl("vllm:spec_decode_num_accepted_tokens", "counter", "tokens", labels=B),
    _vl("vllm:spec_decode_num_draft_tokens", "counter", "tokens", labels=B),
    _vl("vllm:spec_decode_num_drafts", "counter", "", labels=B),
    _vl("vllm:time_to_first_token_seconds", "histogram", "seconds", labels=B),
    _vl(
        "vllm:tool_call_parser_invocations",
        "counter",
        "",
        labels="model_name mode outcome request_type",
    ),
    _vl("vllm:umbp_transfer_bytes", "counter", "bytes", first="0.33.0", labels=B + " operation"),
    _vl("vllm:umbp_transfer_completed", "counter", "", first="0.33.0", labels=B + " operation"),
    _vl("vllm:umbp_transfer_failed", "counter", "", first="0.33.0", labels=B + " operation"),
    _vl("vllm:umbp_transfer_submitted", "counter", "", first="0.33.0", labels=B + " operation"),
    _vl("vllm:watermark_requests", "counter", "requests", labels=B + " status"),
    _vl("vllm:websocket_connection_duration_seconds", "histogram", "seconds", labels=""),
    _vl("vllm:websocket_connections_active", "gauge", "", labels=""),
    _vl("vllm:websocket_connections", "counter", "", labels=""),
)


# Labels that name an engine core. The last one is the primary: a sample without it belongs to
# the endpoint as a whole (API-server counters, process_ and http_ families).
VLLM_IDENTITY_LABELS: tuple[str, ...] = ("engine",)
RAY_IDENTITY_LABELS: tuple[str, ...] = ("ReplicaId", "WorkerId", "engine")

# Label breakdowns users need; every other non-identity label is summed per engine.
BREAKDOWN_LABELS: frozenset[str] = frozenset(
    {"finished_reason", "reason", "source", "position", "sleep_state", "quantile", "operation"}
)

# Labels that only describe where a sample came from; never a breakdown.
DESCRIPTIVE_LABELS: frozenset[str] = frozenset({"model_name"})

# Family name prefixes logged by default (everything is parsed and kept in snapshots).
DEFAULT_LOGGED_PREFIXES: tuple[str, ...] = ("vllm:", "sglang:")

# Ray's metrics agent prefixes `ray_` and turns `:` into `_`.
RAY_PREFIXES: dict[str, str] = {"ray_vllm_": "vllm:", "ray_sglang_": "sglang:"}

PROCESS_START = "process_start_time_seconds"


#: SGLang: ``dp_rank`` names an engine (a DP replica, its own scheduler); absent -> "0"
SGLANG_IDENTITY_LABELS: tuple[str, ...] = ("dp_rank",)
#: SGLang ranks of one engine: every scheduler rank of a replica writes the same series; the
#: lowest (pp_rank, tp_rank, moe_ep_rank) is kept, the others are repeats (docs/sglang.md)
SGLANG_RANK_LABELS: tuple[str, ...] = ("pp_rank", "tp_rank", "moe_ep_rank")
SGLANG_PREFIX = "sglang:"
#: SGLang's disaggregation role label -> fleetscope role (``unified`` / ``dynamic``: none)
SGLANG_ROLE_LABEL = "engine_type"
SGLANG_ROLES: dict[str, str] = {"prefill": "prefill", "decode": "decode"}
#: labels of SGLang's radix-cache and storage collectors, whose ``dp_rank`` is 0 on every DP
#: replica unless DP attention is on (``radix_cache_metric_labels``): in a body with several
#: DP replicas, such a family with only ``dp_rank="0"`` is the sum of all replicas (endpoint)
SGLANG_SHARED_DP_LABELS: frozenset[str] = frozenset({"cache_type", "storage_backend"})

FAMILY_BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
#: every vLLM family name (base names, without ``_total``): another engine's family whose
#: name without its prefix is one of these keeps its prefix in keys unless it is mapped
VLLM_FAMILY_NAMES: frozenset[str] = frozenset(
    f.name.removesuffix("_total") for f in FAMILIES if f.engine == "vllm"
)
# Family base name -> the vLLM 0.32 name it is parsed as (renames and SGLang equivalents).
RENAMES: dict[str, str] = {
    f.name: f.canonical for f in FAMILIES if f.canonical is not None and f.canonical != f.name
}
# older names: dropped when the body also has the canonical family ...
SUPERSEDED: frozenset[str] = frozenset(f.name for f in FAMILIES if f.rename or f.fallback)
# ... except these, which are then kept under their own name
KEEP_OWN_NAME: frozenset[str] = frozenset(f.name for f in FAMILIES if f.fallback)
# per-family breakdowns (parsed name -> labels kept apart) where the global rule does not
# apply: SGLang's own families and vLLM's deprecated ``transfer_type`` families
FAMILY_BREAKDOWNS: dict[str, frozenset[str]] = {
    f.parsed_name: BREAKDOWN_LABELS | frozenset(f.breakdown.split())
    for f in FAMILIES
    if (f.engine == "sglang" and f.canonical is None) or f.deprecated
}


def canonical_family(name: str) -> tuple[str, bool]:
    """Map a family base name to the name it is parsed as. Returns (name, superseded): a
    superseded name's samples give way to the canonical family's when both are present."""
    for ray_prefix, prefix in RAY_PREFIXES.items():
        if name.startswith(ray_prefix):
            name = prefix + name[len(ray_prefix) :]
            break
    renamed = RENAMES.get(name)
    if renamed is not None:
        return renamed, name in SUPERSEDED
    return name, False


# ----------------------------------------------------------------- families the code reads

#: vLLM's KV-consumer gauge: present on servers that fetch KV from a prefill server (decode)
KV_CONSUMER_FAMILY = "vllm:num_requests_kv_fetch_by_stage"
#: preemptions counter family (base name, without ``_total``)
PREEMPTIONS_FAMILY = "vllm:num_preemptions"
#: the waiting-queue gauge broken down by reason; prime-rl names its children
#: ``num_requests_waiting_reason_{reason}``
WAITING_BY_REASON_FAMILY = "vllm:num_requests_waiting_by_reason"
CACHE_CONFIG_INFO = "vllm:cache_config_info"

# per-engine metric names (after the ``vllm:`` prefix is stripped) the view and health read
KV_USAGE = "kv_cache_usage_perc"
RUNNING = "num_requests_running"
WAITING = "num_requests_waiting"
WAITING_FOR_CAPACITY = "num_requests_waiting_reason_capacity"
GENERATION_RATE = "generation_tokens_total:rate"
PROMPT_RATE = "prompt_tokens_total:rate"
PREEMPTION_RATE = "num_preemptions_total:rate"
KV_CAPACITY_TOKENS = "kv_cache_capacity_tokens"


def gauge_metric_name(family_metric: str, labels: Labels) -> str:
    """The per-engine metric name of one gauge child (``family_metric`` has no prefix)."""
    if "vllm:" + family_metric == WAITING_BY_REASON_FAMILY:
        return f"num_requests_waiting_reason_{dict(labels).get('reason', 'unknown')}"
    return family_metric + label_suffix(labels)


def label_suffix(labels: Labels) -> str:
    return "{" + ",".join(f"{k}={v}" for k, v in labels) + "}" if labels else ""


# --------------------------------------------------------------------------- derived metrics


@dataclass(frozen=True, slots=True)
class RatioSpec:
    """A derived ratio: offset + scale * Δnumerator / Δdenominator (both sums of counters)."""

    name: str
    numerator: tuple[str, Mapping[str, str] | None]  # (family metric name, label filter)
    denominator: tuple[str, Mapping[str, str] | None]
    scale: float = 1.0
    offset: float = 0.0
    per_label: str | None = None  # one ratio per value of this numerator label


RATIOS: tuple[RatioSpec, ...] = (
    RatioSpec("prefix_cache_hit_rate", ("prefix_cache_hits", None), ("prefix_cache_queries", None)),
    # SGLang: prompt tokens served from a cache (device, host, storage) over prompt tokens, of
    # finished requests (tokenizer side); no engine has both, so vLLM and SGLang pool together
    RatioSpec("prefix_cache_hit_rate", ("cached_tokens", None), ("prompt_tokens", None)),
    RatioSpec(
        "external_prefix_cache_hit_rate",
        ("external_prefix_cache_hits", None),
        ("external_prefix_cache_queries", None),
    ),
    RatioSpec("mm_cache_hit_rate", ("mm_cache_hits", None), ("mm_cache_queries", None)),
    RatioSpec(
        "preemptions_per_million_output_tokens",
        ("num_preemptions", None),
        ("generation_tokens", None),
        scale=1e6,
    ),
    RatioSpec(
        "length_finished_share",
        ("request_success", {"finished_reason": "length"}),
        ("request_success", None),
    ),
    RatioSpec(
        "spec_decode_acceptance_rate",
        ("spec_decode_num_accepted_tokens", None),
        ("spec_decode_num_draft_tokens", None),
    ),
    # vLLM's mean acceptance length counts the bonus token: 1 + accepted / drafts
    RatioSpec(
        "spec_decode_mean_acceptance_length",
        ("spec_decode_num_accepted_tokens", None),
        ("spec_decode_num_drafts", None),
        offset=1.0,
    ),
    RatioSpec(
        "spec_decode_acceptance_rate_per_position",
        ("spec_decode_num_accepted_tokens_per_pos", None),
        ("spec_decode_num_drafts", None),
        per_label="position",
    ),
)


def ratio_offset(metric: str) -> float:
    """The constant a pooled ratio adds (a per-label ratio shares its spec's offset)."""
    base = metric.split("{", 1)[0]
    for spec in RATIOS:
        if spec.name == base:
            return spec.offset
    return 0.0


#: engine-imbalance metrics: also get `cv` (population std / mean across engines)
SPREAD_METRICS: frozenset[str] = frozenset(
    {RUNNING, WAITING, KV_USAGE, PROMPT_RATE, GENERATION_RATE}
)
#: metrics a prefill engine keeps at ~0 by design: in a scope mixing roles, their tails and
#: averages come from the other engines (the sum still covers every engine)
DECODE_ONLY_METRICS: frozenset[str] = frozenset(
    {GENERATION_RATE, "inter_token_latency_seconds:mean"}
)


def kv_capacity_tokens(info: Mapping[str, Mapping[str, str]]) -> float | None:
    """KV cache capacity in tokens: ``kv_cache_size_tokens``, else blocks x block size."""
    import math

    cfg = info.get(CACHE_CONFIG_INFO)
    if not cfg:
        return None

    def num(key: str) -> float | None:
        try:
            v = float(cfg.get(key, "nan"))
        except ValueError:
            return None
        return v if math.isfinite(v) else None

    size = num("kv_cache_size_tokens")
    if size is not None:
        return size
    blocks, block = num("num_gpu_blocks"), num("block_size")
    if blocks is not None and block is not None:
        return blocks * block
    return None
