"""Everything fleetscope knows about vLLM's metric families, in one place.

Renames across versions, which labels name an engine or a breakdown, Ray's rewriting, the
families the collector reads for admission control and role discovery, the derived ratios and
how per-engine metric names are formed. The parser, the statistics, the view and the health
checks read these tables; no other module spells a vLLM family name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]

# Families renamed across vLLM versions -> the current name (base names, without `_total`).
RENAMES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    # V0's per-token latency histogram; V1 calls it inter-token latency.
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}

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


def canonical_family(name: str) -> tuple[str, bool]:
    """Map a family base name to its current vLLM name. Returns (name, was_renamed)."""
    for ray_prefix, prefix in RAY_PREFIXES.items():
        if name.startswith(ray_prefix):
            name = prefix + name[len(ray_prefix) :]
            break
    renamed = RENAMES.get(name)
    if renamed is not None:
        return renamed, True
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
