"""Key schemas: reduced statistics -> flat ``{key: value}`` for trackers, with a key budget.

* ``prime-rl`` (default, a drop-in for prime-rl users): per engine
  ``inference/{engine_id}/{metric}``, per scope ``inference/{scope}/{metric}/{stat}``.
* ``skyrl``: SkyRL's names, ``vllm/[{window}/][{role}/]{name}`` (see :data:`SKYRL_STEP_KEYS`).

Trackers degrade past ~10k keys, so per-engine keys are bounded: every engine's keys while they
fit in the budget, else only the *tail engines* (the min and max engine of each headline metric
in each scope) with their headline metrics, by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fleetscope.catalog import DECODE_ONLY_METRICS
from fleetscope.stats.reduce import PollStats, ScopeStats

Schema = Literal["prime-rl", "skyrl"]

DEFAULT_KEY_BUDGET = 8000

# what the tails of a large fleet are chosen by
HEADLINE_METRICS: tuple[str, ...] = (
    "kv_cache_usage_perc",
    "num_requests_running",
    "num_requests_waiting",
    "generation_tokens_total:rate",
    "prompt_tokens_total:rate",
    "num_preemptions_total:rate",
    "prefix_cache_hit_rate",
    "time_to_first_token_seconds:mean",
)

# SkyRL step key -> (our metric, our stat)
SKYRL_STEP_KEYS: dict[str, tuple[str, str]] = {
    "num_requests_running": ("num_requests_running", "sum"),
    "num_requests_waiting": ("num_requests_waiting", "sum"),
    "kv_cache_usage_perc": ("kv_cache_usage_perc", "mean"),
    "generation_throughput_tok_s": ("generation_tokens_total:rate", "sum"),
    "prompt_throughput_tok_s": ("prompt_tokens_total:rate", "sum"),
    "prefix_cache_hit_rate": ("prefix_cache_hit_rate", "pooled"),
    "external_prefix_cache_hit_rate": ("external_prefix_cache_hit_rate", "pooled"),
    "ttft_seconds_avg": ("time_to_first_token_seconds:mean", "pooled"),
    "ttft_seconds_p90": ("time_to_first_token_seconds", "p90"),
    "tpot_seconds_avg": ("request_time_per_output_token_seconds:mean", "pooled"),
    "tpot_seconds_p90": ("request_time_per_output_token_seconds", "p90"),
    "num_preemptions": ("num_preemptions_total", "delta"),
    "preemptions_per_million_tokens": ("preemptions_per_million_output_tokens", "pooled"),
    "kv_offload_load_throughput_bytes_s": ("kv_offload_load_bytes_total:rate", "sum"),
    "kv_offload_store_throughput_bytes_s": ("kv_offload_store_bytes_total:rate", "sum"),
    "draft_num_draft_tokens": ("spec_decode_num_draft_tokens_total", "delta"),
    "draft_num_accepted_tokens": ("spec_decode_num_accepted_tokens_total", "delta"),
    "draft_acceptance_rate": ("spec_decode_acceptance_rate", "pooled"),
    "draft_mean_acceptance_length": ("spec_decode_mean_acceptance_length", "pooled"),
    "prompt_throughput_cv": ("prompt_tokens_total:rate", "cv"),
    "generation_throughput_cv": ("generation_tokens_total:rate", "cv"),
}


@dataclass(frozen=True, slots=True)
class KeyOptions:
    schema: Schema = "prime-rl"
    prefix: str | None = None  # default: "inference" (prime-rl) / "vllm" (skyrl)
    key_budget: int = DEFAULT_KEY_BUDGET
    window: str | None = None  # skyrl: "train" / "eval" inserted after the prefix


def key_prefix(options: KeyOptions) -> str:
    """The first key segment: the user's prefix, else ``inference`` (prime-rl) / ``vllm``."""
    return options.prefix or ("vllm" if options.schema == "skyrl" else "inference")


def summary_prefix(options: KeyOptions) -> str:
    """The first segment of run-summary keys."""
    if options.schema == "skyrl":
        return "vllm_correct_aggregate"
    return key_prefix(options) + "_summary"


def _finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))


CORE_SCOPES = ("agg", "prefill", "decode")
# what a user-defined scope keeps when every stat of every scope would not fit the budget
GROUP_HEADLINES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage_perc": ("mean", "max"),
    "num_requests_running": ("sum",),
    "num_requests_waiting": ("sum",),
    "generation_tokens_total": ("delta",),
    "generation_tokens_total:rate": ("sum", "min"),
    "prompt_tokens_total:rate": ("sum",),
    "num_preemptions_total:rate": ("sum",),
    "prefix_cache_hit_rate": ("pooled",),
    "time_to_first_token_seconds": ("p90",),
    "time_to_first_token_seconds:mean": ("pooled",),
}


def scope_keys(
    stats: PollStats,
    prefix: str = "inference",
    budget: int | None = None,
) -> dict[str, float]:
    """Every scope's statistics. Over ``budget``, user-defined scopes (groups, models) keep
    only their headline stats (:data:`GROUP_HEADLINES`), as many scopes as fit; ``agg`` and
    the role scopes are always complete."""

    def render(
        scopes: Iterable[tuple[str, ScopeStats]],
        only: Mapping[str, tuple[str, ...]] | None = None,
    ) -> dict[str, float]:
        out: dict[str, float] = {}
        for scope, s in scopes:
            base = f"{prefix}/{scope}/"
            for metric, per_stat in s.metrics.items():
                wanted = None if only is None else only.get(metric)
                if only is not None and wanted is None:
                    continue
                for stat, v in per_stat.items():
                    if (wanted is None or stat in wanted) and _finite(v):
                        out[f"{base}{metric}/{stat}"] = v
        return out

    out = render(stats.scopes.items())
    if budget is None or len(out) <= budget:
        return out
    core = [(k, v) for k, v in stats.scopes.items() if k in CORE_SCOPES]
    out = render(core)
    # user scopes in order, with their headline stats, while they fit
    for scope in stats.scopes.items():
        if scope[0] in CORE_SCOPES:
            continue
        part = render([scope], GROUP_HEADLINES)
        if len(out) + len(part) > budget:
            break
        out.update(part)
    return out


def engine_keys(
    stats: PollStats,
    prefix: str = "inference",
    engines: Iterable[str] | None = None,
    metrics: Iterable[str] | None = None,
) -> dict[str, float]:
    out: dict[str, float] = {}
    cols = stats.columns
    col_idx = range(len(cols)) if metrics is None else [cols.index(m) for m in metrics if m in cols]
    rows = (
        range(len(stats.engine_ids))
        if engines is None
        else [stats.row_of[e] for e in engines if e in stats.row_of]
    )
    mat = stats.matrix
    for i in rows:
        base = f"{prefix}/{stats.engine_ids[i]}/"
        row = mat[i]
        for j in col_idx:
            v = row[j]
            if v == v and v not in (math.inf, -math.inf):
                out[base + cols[j]] = float(v)
    return out


def tail_engines(stats: PollStats, metrics: Iterable[str] = HEADLINE_METRICS) -> list[str]:
    """The engines at the min and max of each headline metric, per role (stable order).

    Tails are taken within each role (docs/rules.md §3.6): a prefill engine's generation rate
    is ~0 by
    design and must not hide the slowest decode engine. The fleet-wide min and max of a
    metric are among the per-role ones.
    """
    chosen: dict[str, None] = {}
    cols = stats.columns
    is_engine = stats.is_engine
    roles = stats.roles if len(stats.roles) == len(stats.engine_ids) else []
    groups = [is_engine]
    if roles:
        groups = [
            is_engine & np.array([r == role for r in roles], dtype=bool)
            for role in dict.fromkeys(roles)
        ]
    for m in metrics:
        if m not in cols:
            continue
        col = stats.matrix[:, cols.index(m)]
        for group in groups:
            valid = ~np.isnan(col) & group
            if not valid.any():
                continue
            idx = np.flatnonzero(valid)
            vals = col[idx]
            chosen[stats.engine_ids[idx[int(np.argmin(vals))]]] = None
            chosen[stats.engine_ids[idx[int(np.argmax(vals))]]] = None
    return list(chosen)


def prime_rl_keys(
    stats: PollStats, prefix: str = "inference", budget: int = DEFAULT_KEY_BUDGET
) -> dict[str, float]:
    out = scope_keys(stats, prefix, budget)
    n_cols = len(stats.columns)
    if len(out) + n_cols * len(stats.engine_ids) <= budget:
        out.update(engine_keys(stats, prefix))
        return out
    tails = tail_engines(stats)
    room = max(0, budget - len(out))
    per_engine = [m for m in HEADLINE_METRICS if m in stats.columns]
    if per_engine:
        tails = tails[: max(0, room // len(per_engine))]
    out.update(engine_keys(stats, prefix, engines=tails, metrics=per_engine))
    return out


def _skyrl_position_keys(
    metrics: Mapping[str, Mapping[str, float]], sbase: str, out: dict[str, float]
) -> None:
    """SkyRL's ``draft_acceptance_rate_pos_{k}`` (1-based) from the per-position ratios."""
    for metric, per_stat in metrics.items():
        if metric.startswith("spec_decode_acceptance_rate_per_position{position="):
            pos = int(metric.split("=", 1)[1].rstrip("}"))
            v = per_stat.get("pooled")
            if v is not None and _finite(v):
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


def skyrl_keys(
    stats: PollStats, prefix: str = "vllm", window: str | None = None
) -> dict[str, float]:
    """SkyRL's step keys. Role scopes get their own sub-prefix (``vllm/train/decode/...``)."""
    out: dict[str, float] = {}
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
            if v is not None and _finite(v):
                out[sbase + key] = v
        _skyrl_position_keys(s.metrics, sbase, out)
        _cv_engine_keys(stats, scope, sbase, out)
    return out


def poll_keys(stats: PollStats, options: KeyOptions = KeyOptions()) -> dict[str, float]:
    """All keys of one poll under the chosen schema."""
    if options.schema == "skyrl":
        return skyrl_keys(stats, key_prefix(options), options.window)
    return prime_rl_keys(stats, key_prefix(options), options.key_budget)


# ----------------------------------------------------------------------------- windows

SKYRL_SUMMARY_TOTALS: dict[str, str] = {
    "output_tokens_total": "generation_tokens_total",
    "prompt_tokens_total": "prompt_tokens_total",
    "preemptions_total": "num_preemptions_total",
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


def interval_keys(
    stats: PollStats,
    base: str,
    meta: Mapping[str, float | None],
) -> dict[str, float]:
    """Default-schema keys of a window or run label: ``{base}/{scope}/{metric}/{stat}``.

    Cumulative values (a counter's current total) mean nothing over an interval, so those
    columns keep only their exact increase (``delta``); gauge columns are time-weighted.
    """
    out: dict[str, float] = {}
    kinds = stats.kinds
    for scope, s in stats.scopes.items():
        for metric, per_stat in s.metrics.items():
            total = kinds.get(metric) == "total"
            for stat, v in per_stat.items():
                if total and stat != "delta":
                    continue
                if _finite(v):
                    out[f"{base}/{scope}/{metric}/{stat}"] = v
        out[f"{base}/{scope}/engines"] = float(s.engines)
    for k, mv in meta.items():
        if mv is not None and _finite(mv):
            out[f"{base}/{k}"] = float(mv)
    return out


def skyrl_interval_keys(
    stats: PollStats,
    base: str,
    meta: Mapping[str, float | None],
    *,
    summary: bool = False,
) -> dict[str, float]:
    """SkyRL's window keys (``vllm/train/...``) or summary keys (``vllm_correct_aggregate/...``)."""
    out: dict[str, float] = {}
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
            if v is not None and _finite(v):
                out[sbase + key] = v
        if summary:
            for key, metric in SKYRL_SUMMARY_TOTALS.items():
                v = s.metrics.get(metric, {}).get("delta")
                if v is not None and _finite(v):
                    out[sbase + key] = v
            secs = meta.get("active_seconds")
            if secs is not None:
                out[sbase + "measurement_seconds"] = float(secs)
        else:
            _skyrl_position_keys(s.metrics, sbase, out)
            _cv_engine_keys(stats, scope, sbase, out)
    for k in ("coverage", "failed_scrapes", "engine_restarts", "restarts_unseen_tail"):
        v = meta.get(k)
        if v is not None and _finite(v):
            out[f"{base}/{k}"] = float(v)
    return out
