"""The ``skyrl`` key schema: SkyRL's names, ``vllm/[{window}/][{role}/]{name}`` per poll
(:func:`skyrl_keys`, from :data:`SKYRL_STEP_KEYS`), and its window and summary keys
(:func:`skyrl_interval_keys`). Every key is in the compact set.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fleetscope import catalog
from fleetscope.catalog import DECODE_ONLY_METRICS
from fleetscope.keys.sets import KeyDict, is_finite
from fleetscope.stats.reduce import PollStats

# SkyRL step key -> (our metric, our stat)
SKYRL_STEP_KEYS: dict[str, tuple[str, str]] = {
    "num_requests_running": (catalog.RUNNING, "sum"),
    "num_requests_waiting": (catalog.WAITING, "sum"),
    "kv_cache_usage_perc": (catalog.KV_USAGE, "mean"),
    "generation_throughput_tok_s": (catalog.GENERATION_RATE, "sum"),
    "prompt_throughput_tok_s": (catalog.PROMPT_RATE, "sum"),
    "prefix_cache_hit_rate": (catalog.PREFIX_HIT_RATE, "pooled"),
    "external_prefix_cache_hit_rate": ("external_prefix_cache_hit_rate", "pooled"),
    "ttft_seconds_avg": (catalog.TTFT + ":mean", "pooled"),
    "ttft_seconds_p90": (catalog.TTFT, "p90"),
    "tpot_seconds_avg": (catalog.TPOT + ":mean", "pooled"),
    "tpot_seconds_p90": (catalog.TPOT, "p90"),
    "num_preemptions": (catalog.PREEMPTIONS, "delta"),
    "preemptions_per_million_tokens": ("preemptions_per_million_output_tokens", "pooled"),
    "kv_offload_load_throughput_bytes_s": ("kv_offload_load_bytes_total:rate", "sum"),
    "kv_offload_store_throughput_bytes_s": ("kv_offload_store_bytes_total:rate", "sum"),
    "draft_num_draft_tokens": ("spec_decode_num_draft_tokens_total", "delta"),
    "draft_num_accepted_tokens": ("spec_decode_num_accepted_tokens_total", "delta"),
    "draft_acceptance_rate": ("spec_decode_acceptance_rate", "pooled"),
    "draft_mean_acceptance_length": ("spec_decode_mean_acceptance_length", "pooled"),
    "prompt_throughput_cv": (catalog.PROMPT_RATE, "cv"),
    "generation_throughput_cv": (catalog.GENERATION_RATE, "cv"),
}


def _skyrl_position_keys(
    metrics: Mapping[str, Mapping[str, float]], sbase: str, out: dict[str, float]
) -> None:
    """SkyRL's ``draft_acceptance_rate_pos_{k}`` (1-based) from the per-position ratios."""
    for metric, per_stat in metrics.items():
        if metric.startswith("spec_decode_acceptance_rate_per_position{position="):
            pos = int(metric.split("=", 1)[1].rstrip("}"))
            v = per_stat.get("pooled")
            if v is not None and is_finite(v):
                out[f"{sbase}draft_acceptance_rate_pos_{pos + 1}"] = v


def _cv_engines(stats: PollStats, scope: str, metric: str) -> float:
    """How many engines a scope's ``cv`` of ``metric`` is taken over (SkyRL's
    ``*_throughput_cv_num_engines``): the scope's engines with a value, without the prefill
    engines for a decode-only metric in a scope that mixes roles, as the reduction does."""
    n = len(stats.engine_ids)
    if metric not in stats.columns or n == 0:
        return 0.0
    roles = stats.roles if len(stats.roles) == n else [None] * n
    scope_rows = np.array([scope == "agg" or r == scope for r in roles], dtype=bool)
    prefill = np.array([r == "prefill" for r in roles], dtype=bool)
    counted = scope_rows & np.asarray(stats.is_engine, dtype=bool)
    counted &= ~np.isnan(stats.matrix[:, stats.columns.index(metric)])
    mixed = (scope_rows & prefill).any() and (scope_rows & ~prefill).any()
    if metric in DECODE_ONLY_METRICS and mixed:
        counted &= ~prefill
    return float(counted.sum())


def _cv_engine_keys(stats: PollStats, scope: str, sbase: str, out: dict[str, float]) -> None:
    for name in ("prompt_throughput_cv", "generation_throughput_cv"):
        if sbase + name in out:
            metric = SKYRL_STEP_KEYS[name][0]
            out[sbase + name + "_num_engines"] = _cv_engines(stats, scope, metric)


def skyrl_keys(stats: PollStats, prefix: str = "vllm", window: str | None = None) -> KeyDict:
    """SkyRL's step keys. Role scopes get their own sub-prefix (``vllm/train/decode/...``).
    All of them are in the compact set (they are few, and each is one SkyRL key)."""
    out = KeyDict()
    base = f"{prefix}/{window}/" if window else f"{prefix}/"
    for scope, s in stats.scopes.items():
        if scope == "agg":
            sbase = base
        elif scope in ("prefill", "decode"):
            sbase = f"{base}{scope}/"
        else:
            continue
        for key, (metric, stat) in SKYRL_STEP_KEYS.items():
            v = s.metrics.get(metric, {}).get(stat)
            if v is not None and is_finite(v):
                out[sbase + key] = v
        _skyrl_position_keys(s.metrics, sbase, out)
        _cv_engine_keys(stats, scope, sbase, out)
    return out


SKYRL_SUMMARY_TOTALS: dict[str, str] = {
    "output_tokens_total": catalog.GENERATION_TOKENS,
    "prompt_tokens_total": catalog.PROMPT_TOKENS,
    "preemptions_total": catalog.PREEMPTIONS,
    "kv_offload_store_bytes_total": "kv_offload_store_bytes_total",
    "kv_offload_load_bytes_total": "kv_offload_load_bytes_total",
}
_SKYRL_NOT_IN_SUMMARY = {
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "draft_num_draft_tokens",
    "draft_num_accepted_tokens",
    "prompt_throughput_cv",
    "generation_throughput_cv",
}


def skyrl_interval_keys(
    stats: PollStats,
    base: str,
    meta: Mapping[str, float | None],
    *,
    summary: bool = False,
) -> KeyDict:
    """SkyRL's window keys (``vllm/train/...``) or summary keys (``vllm_correct_aggregate/...``)."""
    out = KeyDict()
    for scope, s in stats.scopes.items():
        if scope == "agg":
            sbase = f"{base}/"
        elif scope in ("prefill", "decode"):
            sbase = f"{base}/{scope}/"
        else:
            continue
        for key, (metric, stat) in SKYRL_STEP_KEYS.items():
            if summary and key in _SKYRL_NOT_IN_SUMMARY:
                continue
            v = s.metrics.get(metric, {}).get(stat)
            if v is not None and is_finite(v):
                out[sbase + key] = v
        if summary:
            for key, metric in SKYRL_SUMMARY_TOTALS.items():
                v = s.metrics.get(metric, {}).get("delta")
                if v is not None and is_finite(v):
                    out[sbase + key] = v
            secs = meta.get("active_seconds")
            if secs is not None:
                out[sbase + "measurement_seconds"] = float(secs)
        else:
            _skyrl_position_keys(s.metrics, sbase, out)
            _cv_engine_keys(stats, scope, sbase, out)
    for k in ("coverage", "failed_scrapes", "engine_restarts", "restarts_unseen_tail"):
        v = meta.get(k)
        if v is not None and is_finite(v):
            out[f"{base}/{k}"] = float(v)
    return out
