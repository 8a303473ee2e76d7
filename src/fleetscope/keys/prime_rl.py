"""The default ``prime-rl`` key schema and the key budget.

Per scope ``{prefix}/{scope}/{metric}/{stat}`` (:func:`scope_keys`), per engine
``{prefix}/{engine_id}/{metric}`` (:func:`engine_keys`), and a window's or run label's keys
(:func:`interval_keys`). Trackers degrade past ~10k keys, so :func:`prime_rl_keys` bounds the
per-engine keys: every engine's keys while the keys really emitted (finite values) fit in the
budget, else every engine's headline metrics if those fit, else only the *tail engines* (the
min and max engine of each headline metric in each role) with their headline metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from fleetscope import catalog
from fleetscope.keys.sets import (
    KeyDict,
    compact_engine_column,
    compact_stats,
    histogram_of,
    is_finite,
)
from fleetscope.stats.reduce import PollStats, ScopeStats

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
                    metric, kind, histogram_of(metric, kinds) is not None, interval
                )
                for stat, v in per_stat.items():
                    if (wanted is None or stat in wanted) and is_finite(v):
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
        if mv is not None and is_finite(mv):
            out[f"{base}/{k}"] = float(mv)
    return out
