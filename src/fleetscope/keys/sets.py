"""The compact and full key sets.

The *compact* set (W&B's default) leaves out what means nothing or repeats another key (a
cross-engine median of a cumulative total, a histogram's ``_sum``, a histogram's observation
count that equals the request count, ...): the rules are :func:`compact_stats` (a scope's
stats) and :func:`compact_engine_column` (an engine's columns), documented in docs/sinks.md.
:class:`KeyDict` is the full set with the names the compact set leaves out (``full_only``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Literal

from fleetscope.stats.reduce import QUANTILE_STATS

KeySet = Literal["compact", "full"]
KEY_SETS: tuple[KeySet, ...] = ("compact", "full")


def is_finite(v: float) -> bool:
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


def histogram_of(metric: str, kinds: Mapping[str, str]) -> str | None:
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
    quantiles = QUANTILE_STATS
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
    hist = histogram_of(column, kinds) if kind == "rate" else None
    return hist is None or hist in COUNTED_HISTOGRAMS
