"""Per-engine metrics and cross-engine reductions per scope. Pure: no I/O, no clocks.

Every engine's delta is turned into named per-engine metrics through a *plan* built once per
layout (:mod:`fleetscope.stats.plans`: values, rates, ratios, KV capacity).

Per scope (a set of engines): ``min max sum mean median`` of the per-engine values, ``pooled``
(sum of numerators / sum of denominators) for ratios and histogram means, ``cv`` (spread across
engines) for the load-balance metrics, and ``p50 p90 p99`` from bucket deltas pooled over the
scope on the intersection of bucket bounds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fleetscope.catalog import (
    DECODE_ONLY_METRICS,
    DEFAULT_LOGGED_PREFIXES,
    SPREAD_METRICS,
    ratio_offset,
)
from fleetscope.identity import Role
from fleetscope.stats.limits import ScopeLimits, finite_matrix, scope_limits
from fleetscope.stats.plans import HistogramSpec, Plan, engine_matrix, metric_name, plan_for
from fleetscope.stats.pollstats import EngineInput, PollStats, ScopeStats
from fleetscope.stats.quantiles import pool_buckets, quantile_and_clamp

__all__ = [
    "CLAMPED",
    "POOLED_BOUNDS",
    "QUANTILES",
    "QUANTILE_STATS",
    "STATS",
    "EngineInput",
    "HistogramSpec",
    "Partial",
    "Plan",
    "PollStats",
    "ScopeStats",
    "engine_matrix",
    "finish_reduce",
    "merge_partials",
    "metric_name",
    "partial_reduce",
    "plan_for",
    "reduce_poll",
]

STATS: tuple[str, ...] = ("min", "max", "sum", "mean", "median")
QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
#: beside a quantile whose rank fell in ``+Inf`` (``p99_clamped``: 1.0): its value is the
#: highest finite bound, a floor of the true quantile
CLAMPED = "_clamped"
#: every stat a scope's quantiles may write: ``p50``... and their clamped flags
QUANTILE_STATS: frozenset[str] = frozenset({*QUANTILES, *(q + CLAMPED for q in QUANTILES)})
#: per scope and histogram, next to the quantiles: finite bounds of the pooled bucket layout
POOLED_BOUNDS = "pooled_bounds"


@dataclass
class Partial:
    """A mergeable part of one poll's reduction (one shard of the fleet, or all of it).

    Per-engine rows (metrics, the increases behind rates, ratio numerators/denominators) and,
    per scope, histogram bucket deltas already summed per bucket layout. Merging parts and
    finishing gives exactly what reducing all engines at once gives.
    """

    engine_ids: list[str]
    roles: list[Role | None]
    groups: list[tuple[str, ...]]
    is_engine: np.ndarray
    seconds: np.ndarray
    columns: list[str]
    kinds: dict[str, str]
    matrix: np.ndarray
    rate_delta: np.ndarray
    ratio_num: np.ndarray
    ratio_den: np.ndarray
    # scope -> histogram -> [(bounds, summed bucket deltas)], one item per layout and part
    hist_sums: dict[str, dict[str, list[tuple[tuple[float, ...], np.ndarray]]]]
    scope_names: list[str]


def _scope_masks(
    roles: Sequence[Role | None], groups: Sequence[tuple[str, ...]], extra: Iterable[str]
) -> dict[str, np.ndarray]:
    n = len(roles)
    masks: dict[str, np.ndarray] = {"agg": np.ones(n, dtype=bool)}
    for role in ("prefill", "decode"):
        if role in roles:
            masks[role] = np.array([r == role for r in roles], dtype=bool)
    for name in extra:
        masks.setdefault(name, np.zeros(n, dtype=bool))
    for i, gs in enumerate(groups):
        for g in gs:
            masks.setdefault(g, np.zeros(n, dtype=bool))[i] = True
    return masks


def partial_reduce(
    inputs: Sequence[EngineInput],
    *,
    prefixes: Sequence[str] = DEFAULT_LOGGED_PREFIXES,
    extra_scopes: Iterable[str] = (),
) -> Partial:
    """The per-engine half of a reduction (see :class:`Partial`)."""
    n = len(inputs)
    # group rows by plan (= layout) so identical engines are computed together
    by_plan: dict[int, tuple[Plan, list[int]]] = {}
    for i, inp in enumerate(inputs):
        plan = plan_for(inp.delta.layout, prefixes)
        by_plan.setdefault(id(plan), (plan, []))[1].append(i)

    columns: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for plan, _rows in by_plan.values():
        for name, kind in zip(plan.names, plan.kinds, strict=True):
            columns.setdefault(name, len(columns))
            kinds.setdefault(name, kind)
    matrix = np.full((n, len(columns)), np.nan)
    seconds = np.array([inp.delta.seconds for inp in inputs], dtype=float)
    rate_delta = np.full((n, len(columns)), np.nan)  # the increase behind each `:rate`
    ratio_num = np.full((n, len(columns)), np.nan)
    ratio_den = np.full((n, len(columns)), np.nan)
    hist_parts: dict[str, list[tuple[tuple[float, ...], np.ndarray, list[int]]]] = {}

    for plan, rows in by_plan.values():
        values = np.stack([inputs[i].delta.current.data for i in rows])
        deltas = np.stack([inputs[i].delta.delta for i in rows])
        spans = None
        if any(inputs[i].delta.span is not None for i in rows):
            # per-slot rate spans (a series compared with a value carried from an earlier poll)
            spans = np.stack(
                [
                    d.span if d.span is not None else np.full(len(d.delta), d.seconds)
                    for d in (inputs[i].delta for i in rows)
                ]
            )
        out, dcols = engine_matrix(plan, values, deltas, seconds[rows], spans)
        cols = np.array([columns[c] for c in plan.names], dtype=np.intp)
        matrix[np.ix_(np.asarray(rows, dtype=np.intp), cols)] = out
        if len(plan.rate_cols):
            rate_delta[np.ix_(rows, cols[plan.rate_cols])] = dcols[:, plan.rate_src]
        if len(plan.ratio_cols):
            rc = cols[plan.ratio_cols]
            ratio_num[np.ix_(rows, rc)] = plan.ratio_scale * dcols[:, plan.ratio_num]
            ratio_den[np.ix_(rows, rc)] = dcols[:, plan.ratio_den]
        for h in plan.histograms:
            hist_parts.setdefault(h.name, []).append((h.bounds, deltas[:, h.buckets], rows))

    roles = [inp.role for inp in inputs]
    groups = [tuple(inp.groups) for inp in inputs]
    extra = list(extra_scopes)
    masks = _scope_masks(roles, groups, extra)
    hist_sums: dict[str, dict[str, list[tuple[tuple[float, ...], np.ndarray]]]] = {}
    for scope, mask in masks.items():
        per_scope = hist_sums.setdefault(scope, {})
        for name, parts in hist_parts.items():
            for bounds, bdeltas, rows in parts:
                sel = mask[rows]
                if not sel.any():
                    continue
                block = bdeltas[sel]
                known = ~np.isnan(block).all(axis=1)  # engines with a delta (not baseline-only)
                if known.any():
                    with np.errstate(over="ignore", invalid="ignore"):
                        summed = block[known].sum(axis=0)
                    per_scope.setdefault(name, []).append((bounds, summed))
    return Partial(
        engine_ids=[inp.engine_id for inp in inputs],
        roles=roles,
        groups=groups,
        is_engine=np.array([inp.is_engine for inp in inputs], dtype=bool),
        seconds=seconds,
        columns=list(columns),
        kinds=kinds,
        matrix=matrix,
        rate_delta=rate_delta,
        ratio_num=ratio_num,
        ratio_den=ratio_den,
        hist_sums=hist_sums,
        scope_names=extra,
    )


def merge_partials(parts: Sequence[Partial]) -> Partial:
    """Concatenate parts (in order: rows keep the order of the parts)."""
    if len(parts) == 1:
        return parts[0]
    columns: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for p in parts:
        for c in p.columns:
            columns.setdefault(c, len(columns))
            kinds.setdefault(c, p.kinds[c])
    n = sum(len(p.engine_ids) for p in parts)
    k = len(columns)
    mats = {f: np.full((n, k), np.nan) for f in ("matrix", "rate_delta", "ratio_num", "ratio_den")}
    row = 0
    for p in parts:
        cols = np.array([columns[c] for c in p.columns], dtype=np.intp)
        rows = np.arange(row, row + len(p.engine_ids))
        for f, m in mats.items():
            m[np.ix_(rows, cols)] = getattr(p, f)
        row += len(p.engine_ids)
    hist_sums: dict[str, dict[str, list[tuple[tuple[float, ...], np.ndarray]]]] = {}
    for p in parts:
        for scope, per in p.hist_sums.items():
            dst = hist_sums.setdefault(scope, {})
            for name, items in per.items():
                dst.setdefault(name, []).extend(items)
    scope_names: list[str] = []
    for p in parts:
        scope_names += [s for s in p.scope_names if s not in scope_names]
    return Partial(
        engine_ids=[e for p in parts for e in p.engine_ids],
        roles=[r for p in parts for r in p.roles],
        groups=[g for p in parts for g in p.groups],
        is_engine=np.concatenate([p.is_engine for p in parts]),
        seconds=np.concatenate([p.seconds for p in parts]),
        columns=list(columns),
        kinds=kinds,
        hist_sums=hist_sums,
        scope_names=scope_names,
        **mats,
    )


def finish_reduce(part: Partial) -> PollStats:
    """The cross-engine half: scope statistics from (merged) parts."""
    masks = _scope_masks(part.roles, part.groups, part.scope_names)
    names = part.columns
    prefill_rows = np.array([r == "prefill" for r in part.roles], dtype=bool)
    decode_only = np.array([nm in DECODE_ONLY_METRICS for nm in names], dtype=bool)
    scopes: dict[str, ScopeStats] = {}
    limits = ScopeLimits()
    for scope, mask in masks.items():
        mixed = (mask & prefill_rows).any() and (mask & ~prefill_rows).any()
        scopes[scope] = _reduce_scope(
            mask,
            part.is_engine,
            part.matrix,
            names,
            part.kinds,
            part.rate_delta,
            part.ratio_num,
            part.ratio_den,
            part.hist_sums.get(scope, {}),
            prefill_rows if mixed else None,
            decode_only,
        )
        limits.extend(scopes[scope].limits, scope + "/")
    return PollStats(
        engine_ids=part.engine_ids,
        columns=names,
        matrix=finite_matrix(part.matrix, part.engine_ids, names, limits),
        scopes=scopes,
        is_engine=part.is_engine,
        seconds=part.seconds,
        kinds=part.kinds,
        roles=part.roles,
        limits=limits,
    )


def reduce_poll(
    inputs: Sequence[EngineInput],
    *,
    prefixes: Sequence[str] = DEFAULT_LOGGED_PREFIXES,
    extra_scopes: Iterable[str] = (),
) -> PollStats:
    """Reduce one poll's engine deltas into per-engine metrics and scope statistics.

    Scopes: ``agg`` (everything), ``prefill`` / ``decode`` when any input has that role, and
    every name in an input's ``groups`` (user-defined scopes, e.g. per model).
    """
    return finish_reduce(partial_reduce(inputs, prefixes=prefixes, extra_scopes=extra_scopes))


def _column_stats(sub: np.ndarray) -> dict[str, np.ndarray]:
    finite = ~np.isnan(sub)
    count = finite.sum(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = {
            "min": np.nanmin(sub, axis=0) if sub.shape[0] else np.full(sub.shape[1], np.nan),
            "max": np.nanmax(sub, axis=0) if sub.shape[0] else np.full(sub.shape[1], np.nan),
            "sum": np.where(count > 0, np.nansum(sub, axis=0), np.nan),
            "mean": np.nanmean(sub, axis=0) if sub.shape[0] else np.full(sub.shape[1], np.nan),
            "median": np.nanmedian(sub, axis=0) if sub.shape[0] else np.full(sub.shape[1], np.nan),
        }
        mean = res["mean"]
        std = np.nanstd(sub, axis=0) if sub.shape[0] else np.full(sub.shape[1], np.nan)
        res["cv"] = np.where((count >= 2) & (mean > 0), std / np.where(mean > 0, mean, 1), np.nan)
    return res


def _reduce_scope(
    mask: np.ndarray,
    is_engine: np.ndarray,
    matrix: np.ndarray,
    names: list[str],
    kinds: Mapping[str, str],
    rate_delta: np.ndarray,
    ratio_num: np.ndarray,
    ratio_den: np.ndarray,
    hist_sums: Mapping[str, list[tuple[tuple[float, ...], np.ndarray]]],
    prefill_rows: np.ndarray | None,
    decode_only: np.ndarray,
) -> ScopeStats:
    stats = ScopeStats(engines=int((mask & is_engine).sum()))
    sub = matrix[mask]
    res = _column_stats(sub)
    if prefill_rows is not None and decode_only.any():
        # tails of decode-only metrics come from the non-prefill engines of the scope
        alt = _column_stats(matrix[mask & ~prefill_rows][:, decode_only])
        for stat in ("min", "max", "mean", "median", "cv"):
            res[stat][decode_only] = alt[stat]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rn, rd = ratio_num[mask], ratio_den[mask]
        ok = ~np.isnan(rn) & ~np.isnan(rd)
        num = np.where(ok, rn, 0).sum(axis=0)
        den = np.where(ok, rd, 0).sum(axis=0)
        pooled = num / np.where(den > 0, den, np.nan)
        pooled[~(np.isfinite(num) & np.isfinite(den))] = np.inf  # overflowed: not a number
        rd_sub = rate_delta[mask]
        rd_count = (~np.isnan(rd_sub)).sum(axis=0)
        rd_sum = np.where(rd_count > 0, np.nansum(rd_sub, axis=0), np.nan)
    # values that are not finite are left out (and named), never reported (stats/limits.py)
    stats.limits = scope_limits(
        names, kinds, {**{st: res[st] for st in STATS}, "delta": rd_sum, "pooled": pooled}
    )
    metrics = stats.metrics
    for j, name in enumerate(names):
        if kinds.get(name) == "rate" and math.isfinite(rd_sum[j]):
            # the scope's exact increase over the interval, under the counter's own name
            metrics.setdefault(name.removesuffix(":rate"), {})["delta"] = float(rd_sum[j])
        m: dict[str, float] = {}
        for stat in STATS:
            v = res[stat][j]
            if math.isfinite(v):
                m[stat] = float(v)
        if name in SPREAD_METRICS and math.isfinite(res["cv"][j]):
            m["cv"] = float(res["cv"][j])
        if kinds.get(name) == "ratio" and math.isfinite(pooled[j]):
            m["pooled"] = float(pooled[j] + ratio_offset(name))
        if m:
            metrics.setdefault(name, {}).update(m)
    _add_quantiles(stats, hist_sums)
    return stats


def _add_quantiles(
    stats: ScopeStats, hist_sums: Mapping[str, list[tuple[tuple[float, ...], np.ndarray]]]
) -> None:
    """A scope's quantiles from its pooled bucket deltas (none when a count overflowed)."""
    for name, pooled_parts in hist_sums.items():
        if not pooled_parts:
            continue
        b, c = pool_buckets(pooled_parts)
        if np.count_nonzero(np.isinf(c)):  # bucket counts past float64: no quantile
            stats.limits.not_finite.append(f"{name}/quantiles")
            continue
        _quantiles(stats.metrics.setdefault(name, {}), b, c)


def _quantiles(m: dict[str, float], b: tuple[float, ...], c: np.ndarray) -> None:
    """A scope's quantiles of one histogram from its pooled bucket counts."""
    for label, q in QUANTILES.items():
        v, clamped = quantile_and_clamp(q, b, c)
        if not math.isnan(v):
            m[label] = v
            if clamped:  # the highest finite bound: a floor, not the value (rules §3.5)
                m[label + CLAMPED] = 1.0
    if any(label in m for label in QUANTILES):
        # how coarse the pooled layout was (the intersection of the scope's layouts): a
        # p90 from 6 shared bounds is not a fine one
        m[POOLED_BOUNDS] = float(sum(1 for x in b if math.isfinite(x)))
