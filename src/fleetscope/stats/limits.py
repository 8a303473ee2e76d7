"""Statistics at the limits of float64 (docs/bad-data.md §13, docs/rules.md §3.9).

Every sum fleetscope makes is a float64: a scope's sum or increase, a window's or the run's
total, a rate, a pooled ratio or histogram. One whose inputs are finite but whose result is not
(past ~1.8e308) is **not reported as a number**: the reductions leave it out and name it
(:attr:`ScopeLimits.not_finite`), the caller warns (rate-limited). The sums themselves run
under ``np.errstate(over="ignore", invalid="ignore")``: numpy never prints an overflow warning
on a trainer's stderr.

Past 2**53 a float64 no longer holds every integer: a counter total or increase that large is
rounded (to a multiple of 2, 4, ...). Such sums are named too (:attr:`ScopeLimits.inexact`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

#: the first integer float64 cannot tell from its neighbour: sums past it are rounded
EXACT_INTEGERS = 2.0**53

# the stats of integer-valued columns that are fleetscope's own sums
_SUMMED_KINDS = {"sum": ("total",), "delta": ("rate",)}


@dataclass
class ScopeLimits:
    """What one reduction left out: ``not_finite`` (``{metric}/{stat}`` or
    ``{engine}/{column}``), and the counter sums past 2**53 (``inexact``, still reported)."""

    not_finite: list[str] = field(default_factory=list)
    inexact: list[str] = field(default_factory=list)

    def extend(self, other: ScopeLimits, prefix: str) -> None:
        self.not_finite += [prefix + n for n in other.not_finite]
        self.inexact += [prefix + n for n in other.inexact]


def infinite_entries(values: np.ndarray, names: Sequence[str], suffix: str) -> list[str]:
    """``{name}{suffix}`` of every infinite entry of ``values`` (NaN is missing, not counted)."""
    bad = np.isinf(values)
    if not np.count_nonzero(bad):
        return []
    return [names[j] + suffix for j in np.flatnonzero(bad).tolist()]


def scope_limits(
    names: Sequence[str],
    kinds: Mapping[str, str],
    columns: Mapping[str, np.ndarray],
) -> ScopeLimits:
    """One scope's stats (``stat -> one value per column``) that are not finite, and the
    counter totals and increases past 2**53 (histogram ``_sum`` columns are not integers)."""
    out = ScopeLimits()
    for stat, values in columns.items():
        if stat == "delta":  # a scope's increase is named after its counter, not its rate
            shown: Sequence[str] = [n.removesuffix(":rate") for n in names]
        else:
            shown = names
        out.not_finite += infinite_entries(values, shown, "/" + stat)
        summed = _SUMMED_KINDS.get(stat)
        if summed is None:
            continue
        big = (np.abs(values) >= EXACT_INTEGERS) & np.isfinite(values)  # NaN compares false
        for j in np.flatnonzero(big).tolist():
            if kinds.get(names[j]) in summed and not shown[j].endswith("_sum"):
                out.inexact.append(f"{shown[j]}/{stat}")
    return out


def finite_matrix(
    matrix: np.ndarray, engines: Sequence[str], columns: Sequence[str], limits: ScopeLimits
) -> np.ndarray:
    """Per-engine values with the infinite ones (a rate or a sum past float64) made missing
    (NaN) and named in ``limits`` (``{engine}/{column}``); ``matrix`` itself when all are."""
    inf = np.isinf(matrix)
    if not np.count_nonzero(inf):
        return matrix
    rows = [e + "/" for e in engines]
    for j in np.flatnonzero(inf.any(axis=0)).tolist():
        limits.not_finite += infinite_entries(matrix[:, j], rows, columns[j])
    return np.where(inf, np.nan, matrix)
