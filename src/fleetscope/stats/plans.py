"""Per-engine *plans*: every per-engine metric of one layout, as column operations.

A plan is built once per layout (so a fleet of identical engines is one matrix operation):

* gauges, counters and histogram ``_sum``/``_count``: their current value;
* counters: ``:rate`` = delta / the engine's own seconds; histograms: ``:rate`` (count/s) and
  ``:mean`` (delta sum / delta count);
* ratios (docs/rules.md §4): prefix-cache hit rate, preemptions per million output tokens, share of
  requests finished by ``length``, speculative-decoding acceptance... as delta / delta;
* KV capacity in tokens from ``cache_config_info``.

Pure: no I/O, no clocks. The cross-engine reductions per scope are in
:mod:`fleetscope.stats.reduce`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from fleetscope.catalog import (
    DEFAULT_LOGGED_PREFIXES,
    RATIOS,
    VLLM_FAMILY_NAMES,
    RatioSpec,
    gauge_metric_name,
    kv_capacity_tokens,
    label_suffix,
)
from fleetscope.exposition.snapshot import CounterSeries, EngineLayout, GaugeSeries
from fleetscope.exposition.textformat import Labels


def metric_name(family: str, prefixes: Sequence[str] = DEFAULT_LOGGED_PREFIXES) -> str:
    """A family's per-engine metric name: its engine prefix stripped. A family of another
    engine whose stripped name is a vLLM family's but means something else (SGLang's
    inter-token latency) keeps its engine in the name (``sglang_...``): never one key for both."""
    for p in prefixes:
        if family.startswith(p):
            name = family[len(p) :]
            if p != "vllm:" and "vllm:" + name.removesuffix("_total") in VLLM_FAMILY_NAMES:
                return p.rstrip(":") + "_" + name
            return name
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


_S = TypeVar("_S", CounterSeries, GaugeSeries)


def _by_family(series: Sequence[_S], prefixes: tuple[str, ...]) -> dict[str, list[_S]]:
    """Logged counters (or gauges) by their per-engine metric name, in layout order."""
    out: dict[str, list[_S]] = {}
    for c in series:
        if _logged(c.name, prefixes):
            out.setdefault(metric_name(c.name, prefixes), []).append(c)
    return out


def _plan_gauges(b: _PlanBuilder, gauges_by_family: dict[str, list[GaugeSeries]]) -> None:
    """Each gauge's value, and its family's total next to its labelled children."""
    for fam, children in gauges_by_family.items():
        named = [(gauge_metric_name(fam, g.labels), g.slot) for g in children]
        if (len(children) > 1 or children[0].labels) and named[0][0].startswith(fam + "{"):
            b.value(fam, [g.slot for g in children])  # the family's total, next to its children
        for name, slot in named:
            b.value(name, [slot])


def _plan_counters(b: _PlanBuilder, counters_by_family: dict[str, list[CounterSeries]]) -> None:
    """Each counter's total and rate, and its family's next to its labelled children."""
    for fam, members in counters_by_family.items():
        name = fam + "_total"
        if len(members) > 1 or members[0].labels:
            b.value(name, [c.slot for c in members], "total")
            b.rate(name + ":rate", [c.slot for c in members])
        for c in members:
            b.value(name + label_suffix(c.labels), [c.slot], "total")
            b.rate(name + label_suffix(c.labels) + ":rate", [c.slot])


def _plan_histograms(b: _PlanBuilder, layout: EngineLayout, prefixes: tuple[str, ...]) -> None:
    """Each logged histogram's ``_sum``, ``_count``, rate, mean, and buckets (quantiles)."""
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


def _plan_ratio(
    b: _PlanBuilder, spec: RatioSpec, counters_by_family: dict[str, list[CounterSeries]]
) -> None:
    """One catalog ratio (docs/rules.md §4), when the layout has its counters."""
    num_fam, num_filter = spec.numerator
    den_fam, den_filter = spec.denominator
    nums = counters_by_family.get(num_fam)
    dens = counters_by_family.get(den_fam)
    if not nums or not dens:
        return
    den_slots = [c.slot for c in dens if _match(c.labels, den_filter)]
    if not den_slots:
        return
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
        return
    num_slots = [c.slot for c in nums if _match(c.labels, num_filter)]
    for fam in spec.numerator_plus:
        num_slots += [c.slot for c in counters_by_family.get(fam, ())]
    if num_slots:
        b.ratio(spec.name, num_slots, den_slots, spec.scale, spec.offset)


def _build_plan(layout: EngineLayout, prefixes: tuple[str, ...]) -> Plan:
    b = _PlanBuilder()
    counters_by_family = _by_family(layout.counters, prefixes)
    gauges_by_family = _by_family(layout.gauges, prefixes)
    _plan_gauges(b, gauges_by_family)
    _plan_counters(b, counters_by_family)
    _plan_histograms(b, layout, prefixes)
    for spec in RATIOS:
        _plan_ratio(b, spec, counters_by_family)
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
    # a sum or a rate past float64 is inf, silently: reduce names it (stats/limits.py)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if len(plan.value_cols):
            out[:, plan.value_cols] = _sum_groups(values, plan.value_idx, plan.value_starts)
        dcols = _sum_groups(deltas, plan.delta_idx, plan.delta_starts)
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
