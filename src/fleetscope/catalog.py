"""What fleetscope knows about vLLM's metric families: renames, label roles, Ray's rewriting.

Plain data, no logic beyond name mapping, so the parser and the statistics stay generic.
"""

from __future__ import annotations

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
    {"finished_reason", "reason", "source", "position", "sleep_state", "quantile"}
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
