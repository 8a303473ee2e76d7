"""The sink interface: where fleet statistics go after they are reduced to keys.

A sink receives flat ``{key: value}`` mappings. It never raises into the caller's loop for
tracker-side trouble: it logs a rate-limited warning and drops what it could not write.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

Value = float | int | str


@runtime_checkable
class Sink(Protocol):
    """Receives one flat mapping per poll, and the run summary at the end (and on demand)."""

    def log(self, metrics: Mapping[str, Value], *, step: int, wall_time: float) -> None:
        """Record one poll's keys. ``step`` counts polls from 0; ``wall_time`` is Unix seconds."""
        ...

    def log_summary(self, summary: Mapping[str, Value]) -> None:
        """Record (or overwrite) run-level summary values."""
        ...

    def close(self) -> None:
        """Flush and release resources. Idempotent."""
        ...


def numeric(value: Any) -> float | None:
    """A value as a float for a chart (bools as 0/1), or None for what is not a number."""
    if isinstance(value, bool | numbers.Real):
        return float(value)
    return None
