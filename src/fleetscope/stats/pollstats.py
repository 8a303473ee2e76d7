"""What a reduction gives: per scope its statistics, per poll (or window) every engine's row
and every scope's, and the input rows themselves. Plain data (docs/architecture.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fleetscope.identity import Role
from fleetscope.stats.deltas import EngineDelta
from fleetscope.stats.limits import ScopeLimits

# ----------------------------------------------------------------------------- scopes


@dataclass
class ScopeStats:
    """One scope's reductions: metric -> stat -> value (missing values are absent)."""

    engines: int
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    # stats left out because they are not finite; counter sums past 2**53 (stats/limits.py)
    limits: ScopeLimits = field(default_factory=ScopeLimits)


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
    # every scope's limits (``{scope}/{metric}/{stat}``) and the engine values left out
    # because they are not finite (``{engine}/{column}``: NaN in ``matrix``)
    limits: ScopeLimits = field(default_factory=ScopeLimits)

    @cached_property
    def row_of(self) -> dict[str, int]:
        """Row index of every engine id."""
        return {e: i for i, e in enumerate(self.engine_ids)}

    def engine(self, engine_id: str) -> dict[str, float]:
        """One engine's metrics (missing ones absent)."""
        i = self.row_of[engine_id]
        row = self.matrix[i]
        return {c: float(v) for c, v in zip(self.columns, row, strict=True) if not math.isnan(v)}

    def engine_values(self, columns: Sequence[str]) -> dict[str, dict[str, float]]:
        """Every engine row's values of ``columns`` only (missing ones absent): what a reader
        of a few metrics needs, without building every engine's whole row."""
        index = {c: j for j, c in enumerate(self.columns)}
        wanted = [(c, index[c]) for c in columns if c in index]
        rows = np.flatnonzero(self.is_engine)
        if not wanted or rows.size == 0:
            return {self.engine_ids[i]: {} for i in rows.tolist()}
        cols = np.array([j for _, j in wanted], dtype=np.intp)
        sub = self.matrix[np.ix_(rows, cols)].tolist()
        names = [c for c, _ in wanted]
        return {
            self.engine_ids[i]: {c: v for c, v in zip(names, vals, strict=True) if v == v}
            for i, vals in zip(rows.tolist(), sub, strict=True)
        }


@dataclass(frozen=True, slots=True)
class EngineInput:
    """One row of a reduction: an engine (or an endpoint's engine-less samples) and its scopes."""

    engine_id: str
    delta: EngineDelta
    role: Role | None = None
    groups: tuple[str, ...] = ()
    is_engine: bool = True
