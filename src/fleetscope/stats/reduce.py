"""Per-engine metrics and cross-engine reductions per scope. Pure: no I/O, no clocks.

Every engine's delta is turned into named per-engine metrics through a *plan* built once per
layout (so a fleet of identical engines is one matrix operation):

* gauges, counters and histogram ``_sum``/``_count``: their current value;
* counters: ``:rate`` = delta / the engine's own seconds; histograms: ``:rate`` (count/s) and
  ``:mean`` (delta sum / delta count);
* ratios (docs/rules.md §4): prefix-cache hit rate, preemptions per million output tokens, share of
  requests finished by ``length``, speculative-decoding acceptance... as delta / delta;
* KV capacity in tokens from ``cache_config_info``.

Per scope (a set of engines): ``min max sum mean median`` of the per-engine values, ``pooled``
(sum of numerators / sum of denominators) for ratios and histogram means, ``cv`` (spread across
engines) for the load-balance metrics, and ``p50 p90 p99`` from bucket deltas pooled over the
scope on the intersection of bucket bounds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fleetscope.catalog import (
    DECODE_ONLY_METRICS,
    DEFAULT_LOGGED_PREFIXES,
    RATIOS,
    SPREAD_METRICS,
    gauge_metric_name,
    kv_capacity_tokens,
    label_suffix,
    ratio_offset,
)
from fleetscope.identity import Role
from fleetscope.snapshot import EngineLayout, Labels
from fleetscope.stats.deltas import EngineDelta
from fleetscope.stats.quantiles import bucket_quantile, pool_buckets

STATS: tuple[str, ...] = ("min", "max", "sum", "mean", "median")
QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def metric_name(family: str, prefixes: Sequence[str] = DEFAULT_LOGGED_PREFIXES) -> str:
    for p in prefixes:
        if family.startswith(p):
            return family[len(p) :]
    return family


# ----------------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    name: str  # per-engine metric base name, e.g. "time_to_first_token_seconds"
    bounds: tuple[float, ...]
    buckets: np.ndarray  # slots


@dataclass(eq=False)
class Plan:
    """How to compute every per-engine metric of one layout, as column operations."""

    names: list[str]
    kinds: list[str]  # gauge | total | rate | ratio | const
    value_idx: np.ndarray
    value_starts: np.ndarray
    delta_idx: np.ndarray
    delta_starts: np.ndarray
    # column positions in the output for each kind
    value_cols: np.ndarray
    rate_cols: np.ndarray
    rate_src: np.ndarray  # delta column feeding each rate
    ratio_cols: np.ndarray
    ratio_num: np.ndarray  # delta columns
    ratio_den: np.ndarray
    ratio_scale: np.ndarray
    ratio_offset: np.ndarray
    const_cols: np.ndarray
    const_vals: np.ndarray
    histograms: list[HistogramSpec]


class _PlanBuilder:
    def __init__(self) -> None:
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.value_groups: list[tuple[int, list[int]]] = []  # (col, slots)
        self.delta_groups: list[list[int]] = []
        self.delta_key: dict[tuple[int, ...], int] = {}
        self.rates: list[tuple[int, int]] = []
        self.ratios: list[tuple[int, int, int, float, float]] = []
        self.consts: list[tuple[int, float]] = []
        self.histograms: list[HistogramSpec] = []
        self.seen: set[str] = set()

    def _col(self, name: str, kind: str) -> int | None:
        if name in self.seen:
            return None
        self.seen.add(name)
        self.names.append(name)
        self.kinds.append(kind)
        return len(self.names) - 1

    def delta(self, slots: Sequence[int]) -> int:
        key = tuple(slots)
        j = self.delta_key.get(key)
        if j is None:
            j = len(self.delta_groups)
            self.delta_groups.append(list(slots))
            self.delta_key[key] = j
        return j

    def value(self, name: str, slots: Sequence[int], kind: str = "gauge") -> None:
        """A current value: ``gauge``, or ``total`` for cumulative counters and sums."""
        c = self._col(name, kind)
        if c is not None:
            self.value_groups.append((c, list(slots)))

    def rate(self, name: str, slots: Sequence[int]) -> None:
        c = self._col(name, "rate")
        if c is not None:
            self.rates.append((c, self.delta(slots)))

    def ratio(
        self,
        name: str,
        num: Sequence[int],
        den: Sequence[int],
        scale: float = 1.0,
        offset: float = 0.0,
    ) -> None:
        c = self._col(name, "ratio")
        if c is not None:
            self.ratios.append((c, self.delta(num), self.delta(den), scale, offset))

    def const(self, name: str, value: float) -> None:
        c = self._col(name, "const")
        if c is not None:
            self.consts.append((c, value))

    def build(self) -> Plan:
        def flat(groups: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            idx = [s for g in groups for s in g]
            starts = np.cumsum([0] + [len(g) for g in groups[:-1]]) if groups else np.zeros(0)
            return np.array(idx, dtype=np.intp), np.array(starts, dtype=np.intp)

        v_idx, v_starts = flat([g for _, g in self.value_groups])
        d_idx, d_starts = flat(self.delta_groups)
        i = np.intp
        return Plan(
            names=self.names,
            kinds=self.kinds,
            value_idx=v_idx,
            value_starts=v_starts,
            delta_idx=d_idx,
            delta_starts=d_starts,
            value_cols=np.array([c for c, _ in self.value_groups], dtype=i),
            rate_cols=np.array([c for c, _ in self.rates], dtype=i),
            rate_src=np.array([s for _, s in self.rates], dtype=i),
            ratio_cols=np.array([r[0] for r in self.ratios], dtype=i),
            ratio_num=np.array([r[1] for r in self.ratios], dtype=i),
            ratio_den=np.array([r[2] for r in self.ratios], dtype=i),
            ratio_scale=np.array([r[3] for r in self.ratios], dtype=float),
            ratio_offset=np.array([r[4] for r in self.ratios], dtype=float),
            const_cols=np.array([c for c, _ in self.consts], dtype=i),
            const_vals=np.array([v for _, v in self.consts], dtype=float),
            histograms=self.histograms,
        )


_PLANS: dict[tuple[EngineLayout, tuple[str, ...]], Plan] = {}


def plan_for(layout: EngineLayout, prefixes: Sequence[str] = DEFAULT_LOGGED_PREFIXES) -> Plan:
    key = (layout, tuple(prefixes))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _build_plan(layout, tuple(prefixes))
        if len(_PLANS) > 1024:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _logged(family: str, prefixes: Sequence[str]) -> bool:
    return family.startswith(tuple(prefixes))


def _build_plan(layout: EngineLayout, prefixes: tuple[str, ...]) -> Plan:
    b = _PlanBuilder()
    counters_by_family: dict[str, list] = {}
    for c in layout.counters:
        if _logged(c.name, prefixes):
            counters_by_family.setdefault(metric_name(c.name, prefixes), []).append(c)
    gauges_by_family: dict[str, list] = {}
    for g in layout.gauges:
        if _logged(g.name, prefixes):
            gauges_by_family.setdefault(metric_name(g.name, prefixes), []).append(g)

    for fam, children in gauges_by_family.items():
        named = [(gauge_metric_name(fam, g.labels), g.slot) for g in children]
        if (len(children) > 1 or children[0].labels) and named[0][0].startswith(fam + "{"):
            b.value(fam, [g.slot for g in children])  # the family's total, next to its children
        for name, slot in named:
            b.value(name, [slot])

    for fam, children in counters_by_family.items():
        name = fam + "_total"
        if len(children) > 1 or children[0].labels:
            b.value(name, [c.slot for c in children], "total")
            b.rate(name + ":rate", [c.slot for c in children])
        for c in children:
            b.value(name + label_suffix(c.labels), [c.slot], "total")
            b.rate(name + label_suffix(c.labels) + ":rate", [c.slot])

    for h in layout.histograms:
        if not _logged(h.name, prefixes):
            continue
        name = metric_name(h.name, prefixes) + label_suffix(h.labels)
        if h.sum >= 0:
            b.value(name + "_sum", [h.sum], "total")
        if h.count >= 0:
            b.value(name + "_count", [h.count], "total")
            b.rate(name + ":rate", [h.count])
            if h.sum >= 0:
                b.ratio(name + ":mean", [h.sum], [h.count])
        if h.buckets:
            b.histograms.append(HistogramSpec(name, h.bounds, np.array(h.buckets, dtype=np.intp)))

    for spec in RATIOS:
        num_fam, num_filter = spec.numerator
        den_fam, den_filter = spec.denominator
        nums = counters_by_family.get(num_fam)
        dens = counters_by_family.get(den_fam)
        if not nums or not dens:
            continue
        den_slots = [c.slot for c in dens if _match(c.labels, den_filter)]
        if not den_slots:
            continue
        if spec.per_label:
            for c in nums:
                v = dict(c.labels).get(spec.per_label)
                if v is not None:
                    b.ratio(
                        f"{spec.name}{{{spec.per_label}={v}}}",
                        [c.slot],
                        den_slots,
                        spec.scale,
                        spec.offset,
                    )
            continue
        num_slots = [c.slot for c in nums if _match(c.labels, num_filter)]
        if num_slots:
            b.ratio(spec.name, num_slots, den_slots, spec.scale, spec.offset)

    capacity = kv_capacity_tokens(layout.info)
    if capacity is not None:
        b.const("kv_cache_capacity_tokens", capacity)
    return b.build()


def _match(labels: Labels, want: Mapping[str, str] | None) -> bool:
    if not want:
        return True
    d = dict(labels)
    return all(d.get(k) == v for k, v in want.items())


# ----------------------------------------------------------------------------- per engine


def _sum_groups(mat: np.ndarray, idx: np.ndarray, starts: np.ndarray) -> np.ndarray:
    if not len(idx):
        return np.zeros((mat.shape[0], 0))
    return np.add.reduceat(mat[:, idx], starts, axis=1)


def engine_matrix(
    plan: Plan,
    values: np.ndarray,
    deltas: np.ndarray,
    seconds: np.ndarray,
    spans: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-engine metrics (rows: engines of one layout) and the delta columns behind them.

    ``spans``: optional per-slot seconds (rows x slots, see ``EngineDelta.span``): each rate
    divides by the span of its own increase (a delta group's span = the max over its slots);
    None = every slot spans its row's ``seconds``.
    """
    n = values.shape[0]
    out = np.full((n, len(plan.names)), np.nan)
    if len(plan.value_cols):
        out[:, plan.value_cols] = _sum_groups(values, plan.value_idx, plan.value_starts)
    dcols = _sum_groups(deltas, plan.delta_idx, plan.delta_starts)
    with np.errstate(divide="ignore", invalid="ignore"):
        if len(plan.rate_cols):
            if spans is None or not len(plan.delta_idx):
                sec = np.where(seconds > 0, seconds, np.nan)[:, None]
            else:
                gspan = np.maximum.reduceat(spans[:, plan.delta_idx], plan.delta_starts, axis=1)
                gspan = gspan[:, plan.rate_src]
                sec = np.where(gspan > 0, gspan, np.nan)
            out[:, plan.rate_cols] = dcols[:, plan.rate_src] / sec
        if len(plan.ratio_cols):
            num = dcols[:, plan.ratio_num]
            den = dcols[:, plan.ratio_den]
            r = plan.ratio_offset + plan.ratio_scale * num / np.where(den > 0, den, np.nan)
            out[:, plan.ratio_cols] = r
    if len(plan.const_cols):
        out[:, plan.const_cols] = plan.const_vals
    return out, dcols


# ----------------------------------------------------------------------------- scopes


@dataclass
class ScopeStats:
    """One scope's reductions: metric -> stat -> value (missing values are absent)."""

    engines: int
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class PollStats:
    """The reduced result of one poll (or one window): per engine and per scope."""

    engine_ids: list[str]
    columns: list[str]
    matrix: np.ndarray  # engines x columns, NaN = missing
    scopes: dict[str, ScopeStats]
    is_engine: np.ndarray  # False for endpoint-level rows (API-server counters)
    seconds: np.ndarray
    kinds: dict[str, str] = field(default_factory=dict)  # column -> gauge|total|rate|ratio|const
    roles: list[Role | None] = field(default_factory=list)  # per row, for role-aware tails

    @cached_property
    def row_of(self) -> dict[str, int]:
        """Row index of every engine id."""
        return {e: i for i, e in enumerate(self.engine_ids)}

    def engine(self, engine_id: str) -> dict[str, float]:
        """One engine's metrics (missing ones absent)."""
        i = self.row_of[engine_id]
        row = self.matrix[i]
        return {c: float(v) for c, v in zip(self.columns, row, strict=True) if not math.isnan(v)}


@dataclass(frozen=True, slots=True)
class EngineInput:
    """One row of a reduction: an engine (or an endpoint's engine-less samples) and its scopes."""

    engine_id: str
    delta: EngineDelta
    role: Role | None = None
    groups: tuple[str, ...] = ()
    is_engine: bool = True


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
                    per_scope.setdefault(name, []).append((bounds, block[known].sum(axis=0)))
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
    hist_sums: dict[str, dict[str, list]] = {}
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
    return PollStats(
        engine_ids=part.engine_ids,
        columns=names,
        matrix=part.matrix,
        scopes=scopes,
        is_engine=part.is_engine,
        seconds=part.seconds,
        kinds=part.kinds,
        roles=part.roles,
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
    with np.errstate(divide="ignore", invalid="ignore"):
        rn, rd = ratio_num[mask], ratio_den[mask]
        ok = ~np.isnan(rn) & ~np.isnan(rd)
        num = np.where(ok, rn, 0).sum(axis=0)
        den = np.where(ok, rd, 0).sum(axis=0)
        pooled = num / np.where(den > 0, den, np.nan)
    rd_sub = rate_delta[mask]
    rd_count = (~np.isnan(rd_sub)).sum(axis=0)
    rd_sum = np.where(rd_count > 0, np.nansum(rd_sub, axis=0), np.nan)
    metrics = stats.metrics
    for j, name in enumerate(names):
        if kinds.get(name) == "rate" and not math.isnan(rd_sum[j]):
            # the scope's exact increase over the interval, under the counter's own name
            metrics.setdefault(name.removesuffix(":rate"), {})["delta"] = float(rd_sum[j])
        m: dict[str, float] = {}
        for stat in STATS:
            v = res[stat][j]
            if not math.isnan(v):
                m[stat] = float(v)
        if name in SPREAD_METRICS and not math.isnan(res["cv"][j]):
            m["cv"] = float(res["cv"][j])
        if kinds.get(name) == "ratio" and not math.isnan(pooled[j]):
            m["pooled"] = float(pooled[j] + ratio_offset(name))
        if m:
            metrics.setdefault(name, {}).update(m)
    for name, pooled_parts in hist_sums.items():
        if not pooled_parts:
            continue
        b, c = pool_buckets(pooled_parts)
        m = metrics.setdefault(name, {})
        for label, q in QUANTILES.items():
            v = bucket_quantile(q, b, c)
            if not math.isnan(v):
                m[label] = v
    return stats
