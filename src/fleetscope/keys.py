"""Key schemas: reduced statistics -> flat ``{key: value}`` for trackers, with a key budget.

* ``prime-rl`` (default, a drop-in for prime-rl users): per engine
  ``inference/{engine_id}/{metric}``, per scope ``inference/{scope}/{metric}/{stat}``.
* ``skyrl``: SkyRL's names, ``vllm/[{window}/][{role}/]{name}`` (see :data:`SKYRL_STEP_KEYS`).

Trackers degrade past ~10k keys, so per-engine keys are bounded: every engine's keys while the
keys really emitted (finite values) fit in the budget, else every engine's headline metrics if
those fit, else only the *tail engines* (the min and max engine of each headline metric in each
scope) with their headline metrics, by name.

Two key sets. The *full* set is the complete pass-through (prime-rl's exact key set; JSONL,
TensorBoard, ``WandbSink(keys="full")``). The *compact* set (W&B's default) leaves out what means
nothing or repeats another key (a cross-engine median of a cumulative total, a histogram's
``_sum``, a histogram's observation count that equals the request count, ...): the rules are
:func:`compact_stats` and :func:`compact_engine_column`, documented in docs/sinks.md. Both sets
come from one rendering: every mapping returned here is a :class:`KeyDict`, the full set plus
the names the compact set leaves out (``full_only``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from fleetscope import catalog
from fleetscope.catalog import DECODE_ONLY_METRICS
from fleetscope.stats.reduce import PollStats, ScopeStats

Schema = Literal["prime-rl", "skyrl"]
KeySet = Literal["compact", "full"]
KEY_SETS: tuple[KeySet, ...] = ("compact", "full")

DEFAULT_KEY_BUDGET = 8000

# what the tails of a large fleet are chosen by
HEADLINE_METRICS: tuple[str, ...] = (
    catalog.KV_USAGE,
    catalog.RUNNING,
    catalog.WAITING,
    catalog.GENERATION_RATE,
    catalog.PROMPT_RATE,
    catalog.PREEMPTION_RATE,
    catalog.PREFIX_HIT_RATE,
    catalog.TTFT + ":mean",
)

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


class KeyDict(dict[str, Any]):
    """A flat ``{key: value}`` mapping (the full key set) and ``full_only``: the names of its
    keys that the compact set leaves out.

    ``update`` with another :class:`KeyDict` also takes its ``full_only``; keys added from a
    plain mapping (health, collector, RL keys) are in both sets. ``dict(keys)`` or ``{**keys}``
    give a plain dict (the full set) and lose ``full_only``.
    """

    def __init__(self, *args: Any, full_only: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.full_only: set[str] = set(full_only)

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        for other in args:
            if isinstance(other, KeyDict):
                self.full_only |= other.full_only

    def compact(self) -> dict[str, Any]:
        """The compact key set: every key not in ``full_only``."""
        drop = self.full_only
        if not drop:
            return dict(self)
        return {k: v for k, v in self.items() if k not in drop}

    def select(self, key_set: KeySet) -> dict[str, Any]:
        """``"full"``: this mapping itself (no copy); ``"compact"``: :meth:`compact`."""
        return self if key_set == "full" else self.compact()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_key_dict, (dict(self), sorted(self.full_only)))


def _key_dict(items: dict[str, Any], full_only: list[str]) -> KeyDict:
    return KeyDict(items, full_only=full_only)


def key_set_of(keys: Mapping[str, Any], key_set: KeySet) -> Mapping[str, Any]:
    """``keys`` as ``key_set`` (a plain mapping marks nothing full-only: all of it)."""
    if isinstance(keys, KeyDict):
        return keys.select(key_set)
    return keys


# Histograms whose observation count is not a duplicate: one observation per engine step
# (every other vLLM histogram observes once per request, or once per output token).
COUNTED_HISTOGRAMS = frozenset({"iteration_tokens_total"})


def _is_breakdown(metric: str) -> bool:
    return "{" in metric


def _histogram_of(metric: str, kinds: Mapping[str, str]) -> str | None:
    """The histogram ``metric`` belongs to as its base name or ``:rate`` (observations/s)."""
    base = metric.removesuffix(":rate")
    return base if f"{base}_count" in kinds else None


@lru_cache(maxsize=4096)
def compact_stats(
    metric: str, kind: str | None, histogram: bool, interval: bool
) -> frozenset[str] | None:
    """The stats of a scope's ``metric`` the compact set keeps (``None``: all of them).

    ``kind`` is the column kind (gauge / total / rate / ratio / const; ``None`` for a
    histogram's base name, which carries its quantiles and its observation count ``delta``);
    ``histogram``: ``metric`` is a histogram's base name or its ``:rate``; ``interval``: a
    window's or the run summary's keys rather than a poll's. Reasons in docs/sinks.md.
    """
    quantiles = frozenset({"p50", "p90", "p99"})
    if histogram and kind in (None, "rate"):
        counted = metric.removesuffix(":rate") in COUNTED_HISTOGRAMS
        if kind is None:  # quantiles; the observation count only where it is not a duplicate
            return quantiles | ({"delta"} if interval and counted else set())
        if not counted:  # observations/s = requests/s (or tokens/s) again
            return frozenset()
        return frozenset({"sum"} if interval else {"sum", "min", "max"})
    breakdown = _is_breakdown(metric)
    if kind == "total":
        # a lifetime total: its min/max/mean/median/sum across engines mean nothing; a poll's
        # increase is the rate again; a window's or the run's increase is the point of it
        return frozenset({"delta"}) if interval else frozenset()
    if kind == "rate":
        if interval:
            return frozenset() if breakdown else frozenset({"sum", "cv"})
        return frozenset({"sum"}) if breakdown else frozenset({"sum", "min", "max", "cv"})
    if kind == "ratio":
        return (
            frozenset({"pooled"}) if interval or breakdown else frozenset({"pooled", "min", "max"})
        )
    if kind == "gauge":
        if breakdown:
            return frozenset({"sum"})
        keep = {"mean", "sum", "peak", "cv"} if interval else {"min", "max", "mean", "sum", "cv"}
        if metric.endswith("_perc"):  # a sum of fractions means nothing
            keep.discard("sum")
        return frozenset(keep)
    if kind == "const":
        return frozenset({"sum"}) if interval else frozenset({"sum", "min", "max"})
    return None


def compact_engine_column(column: str, kinds: Mapping[str, str]) -> bool:
    """Whether the compact set keeps an engine's ``column``: not a lifetime total (a counter's
    value, a histogram's ``_sum``/``_count``: the rate says it per poll), not a histogram's
    observations/s (the request rate again, except :data:`COUNTED_HISTOGRAMS`)."""
    kind = kinds.get(column)
    if kind == "total":
        return False
    hist = _histogram_of(column, kinds) if kind == "rate" else None
    return hist is None or hist in COUNTED_HISTOGRAMS


CORE_SCOPES = ("agg", "prefill", "decode")
# what a user-defined scope keeps when every stat of every scope would not fit the budget
GROUP_HEADLINES: dict[str, tuple[str, ...]] = {
    catalog.KV_USAGE: ("mean", "max"),
    catalog.RUNNING: ("sum",),
    catalog.WAITING: ("sum",),
    catalog.GENERATION_TOKENS: ("delta",),
    catalog.GENERATION_RATE: ("sum", "min"),
    catalog.PROMPT_RATE: ("sum",),
    catalog.PREEMPTION_RATE: ("sum",),
    catalog.PREFIX_HIT_RATE: ("pooled",),
    catalog.TTFT: ("p90",),
    catalog.TTFT + ":mean": ("pooled",),
}


def scope_keys(
    stats: PollStats,
    prefix: str = "inference",
    budget: int | None = None,
    *,
    interval: bool = False,
) -> KeyDict:
    """Every scope's statistics. Over ``budget``, user-defined scopes (groups, models) keep
    only their headline stats (:data:`GROUP_HEADLINES`), as many scopes as fit; ``agg`` and
    the role scopes are always complete. Stats the compact set leaves out
    (:func:`compact_stats`) are marked ``full_only``."""
    kinds = stats.kinds

    def render(
        scopes: Iterable[tuple[str, ScopeStats]],
        only: Mapping[str, tuple[str, ...]] | None = None,
    ) -> KeyDict:
        out = KeyDict()
        full_only = out.full_only
        for scope, s in scopes:
            base = f"{prefix}/{scope}/"
            for metric, per_stat in s.metrics.items():
                wanted = None if only is None else only.get(metric)
                if only is not None and wanted is None:
                    continue
                kind = kinds.get(metric)
                if interval and kind == "total":
                    per_stat = {k: v for k, v in per_stat.items() if k == "delta"}
                keep = compact_stats(
                    metric, kind, _histogram_of(metric, kinds) is not None, interval
                )
                for stat, v in per_stat.items():
                    if (wanted is None or stat in wanted) and _finite(v):
                        key = f"{base}{metric}/{stat}"
                        out[key] = v
                        if keep is not None and stat not in keep:
                            full_only.add(key)
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
) -> KeyDict:
    """Per-engine keys ``{prefix}/{engine_id}/{column}`` of every finite value (of
    ``engines`` and ``metrics`` if given); columns the compact set leaves out
    (:func:`compact_engine_column`) are marked ``full_only``."""
    out = KeyDict()
    full_only = out.full_only
    cols = stats.columns
    col_idx = (
        list(range(len(cols))) if metrics is None else [cols.index(m) for m in metrics if m in cols]
    )
    rows = (
        list(range(len(stats.engine_ids)))
        if engines is None
        else [stats.row_of[e] for e in engines if e in stats.row_of]
    )
    if not rows or not col_idx:
        return out
    names = [cols[j] for j in col_idx]
    compact = [compact_engine_column(c, stats.kinds) for c in names]
    sub = stats.matrix[np.ix_(rows, col_idx)]
    ri, ci = np.nonzero(np.isfinite(sub))  # row-major: each engine's keys in column order
    values = sub[ri, ci].tolist()
    bases = [f"{prefix}/{stats.engine_ids[i]}/" for i in rows]
    cs = ci.tolist()
    keys = [bases[r] + names[c] for r, c in zip(ri.tolist(), cs, strict=True)]
    dict.update(out, zip(keys, values, strict=True))
    full_only.update(k for k, c in zip(keys, cs, strict=True) if not compact[c])
    return out


def _finite_cells(stats: PollStats, metrics: Iterable[str] | None = None) -> int:
    """How many per-engine keys :func:`engine_keys` would emit (its finite values)."""
    mat = stats.matrix
    if metrics is not None:
        idx = [stats.columns.index(m) for m in metrics if m in stats.columns]
        mat = mat[:, idx]
    return int(np.isfinite(mat).sum()) if mat.size else 0


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
) -> KeyDict:
    """Scope keys, then per-engine keys within ``budget``, counting the keys really emitted
    (an engine's missing or non-finite values make no key): every engine's keys if they fit;
    else every engine's headline metrics (:data:`HEADLINE_METRICS`) if those fit; else the
    tail engines' (:func:`tail_engines`) headline metrics, as many engines as fit."""
    out = scope_keys(stats, prefix, budget)
    room = budget - len(out)
    if _finite_cells(stats) <= room:
        out.update(engine_keys(stats, prefix))
        return out
    per_engine = [m for m in HEADLINE_METRICS if m in stats.columns]
    if _finite_cells(stats, per_engine) <= room:
        out.update(engine_keys(stats, prefix, metrics=per_engine))
        return out
    tails = tail_engines(stats)
    kept: list[str] = []
    for e in tails:  # in tail order, while their keys fit
        i = stats.row_of[e]
        n = int(np.isfinite(stats.matrix[i, [stats.columns.index(m) for m in per_engine]]).sum())
        if n > room:
            break
        kept.append(e)
        room -= n
    out.update(engine_keys(stats, prefix, engines=kept, metrics=per_engine))
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
            if v is not None and _finite(v):
                out[sbase + key] = v
        _skyrl_position_keys(s.metrics, sbase, out)
        _cv_engine_keys(stats, scope, sbase, out)
    return out


def poll_keys(stats: PollStats, options: KeyOptions = KeyOptions()) -> KeyDict:
    """All keys of one poll under the chosen schema (the full set, compact subset marked)."""
    if options.schema == "skyrl":
        return skyrl_keys(stats, key_prefix(options), options.window)
    return prime_rl_keys(stats, key_prefix(options), options.key_budget)


# ----------------------------------------------------------------------------- windows

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


def interval_keys(
    stats: PollStats,
    base: str,
    meta: Mapping[str, float | None],
) -> KeyDict:
    """Default-schema keys of a window or run label: ``{base}/{scope}/{metric}/{stat}``.

    Cumulative values (a counter's current total) mean nothing over an interval, so those
    columns keep only their exact increase (``delta``); gauge columns are time-weighted.
    The compact subset is marked as for a poll (:func:`compact_stats` with ``interval``).
    """
    out = scope_keys(stats, base, interval=True)
    for scope, s in stats.scopes.items():
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
