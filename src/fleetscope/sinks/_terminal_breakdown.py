"""Where the engines' time went, as the terminal shows it (docs/rules.md §3.13): a line per
window at its stop, and a table of the run summary's labels (the final table of ``watch`` and
``demo``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetscope import catalog
from fleetscope.keys.breakdown import ENGINE_TIME, ROLES, share_key
from fleetscope.stats.breakdown import PHASES, verdict
from fleetscope.stats.tails import TAIL_METRICS

__all__ = ["EngineTimeRow", "engine_time_rows", "engine_time_table", "window_lines"]

_IDLE_SHARE = "/" + share_key("idle")
_SHORT = {catalog.E2E: "e2e", catalog.TTFT: "TTFT"}


@dataclass(frozen=True, slots=True)
class EngineTimeRow:
    """One label's (or one of its roles') breakdown: shares, engine-seconds, tokens per busy
    engine-second, tokens/s, the verdict and the engines that hold the latency tails."""

    label: str
    scope: str
    shares: tuple[float, ...]
    engine_seconds: float | None
    tokens_per_busy_second: float | None
    tokens_per_second: float | None
    verdict: str
    tails: str


def _num(keys: Mapping[str, Any], key: str) -> float | None:
    v = keys.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _rows(keys: Mapping[str, Any], *, summary: bool) -> list[EngineTimeRow]:
    """Every (label, scope) with shares in ``keys``: ``agg`` and the roles, in key order."""
    out: list[EngineTimeRow] = []
    for key in keys:
        if not key.endswith(_IDLE_SHARE):
            continue
        parts = key.split("/")
        if len(parts) != 5 or parts[2] not in ("agg", *ROLES):
            continue
        root, label, scope = parts[0], parts[1], parts[2]
        base = f"{root}/{label}/{scope}"
        vals = [_num(keys, f"{base}/{share_key(p)}") for p in PHASES]
        if any(v is None for v in vals):
            continue
        shares = tuple(v or 0.0 for v in vals)
        stated = keys.get(f"{root}/{label}/bottleneck" if scope == "agg" else f"{base}/bottleneck")
        tails = [
            f"{_SHORT[m]}: {keys[f'{base}/{m}/tail_held_by']}"
            for m in TAIL_METRICS
            if isinstance(keys.get(f"{base}/{m}/tail_held_by"), str)
        ]
        if not summary:  # a window's keys name no engine: how many hold each tail
            tails = [
                f"{_SHORT[m]}: {n:.0f} engines"
                for m in TAIL_METRICS
                if (n := _num(keys, f"{base}/{m}/tail_engines"))
            ]
        rate = _num(keys, f"{base}/{catalog.GENERATION_RATE}/sum")
        named = stated if isinstance(stated, str) else verdict(shares)
        role = keys.get(f"{root}/{label}/bottleneck_role") if scope == "agg" else None
        if isinstance(role, str):  # a prefill/decode fleet: which side holds it back
            named += f" ({role} side)"
        out.append(
            EngineTimeRow(
                label,
                scope,
                shares,
                _num(keys, f"{base}/{ENGINE_TIME}/engine_seconds"),
                _num(keys, f"{base}/{ENGINE_TIME}/tokens_per_busy_engine_second"),
                rate,
                named,
                "; ".join(tails),
            )
        )
    return out


def _pct(v: float) -> str:
    return f"{v:.0%}"


def window_lines(keys: Mapping[str, Any]) -> list[str]:
    """One line per window that stopped in this row (its keys carry its shares):
    ``window train: idle 5% busy 60% saturated 30% paused 0% syncing 5% of 160 engine-s ->
    engines_saturated; 812.0 tok per busy engine-s``."""
    lines = []
    for r in _rows(keys, summary=False):
        if r.scope != "agg":
            continue
        shares = " ".join(f"{p} {_pct(v)}" for p, v in zip(PHASES, r.shares, strict=True))
        secs = "" if r.engine_seconds is None else f" of {r.engine_seconds:,.0f} engine-s"
        line = f"window {r.label}: {shares}{secs} -> {r.verdict}"
        if r.tokens_per_busy_second is not None:
            line += f"; {r.tokens_per_busy_second:,.1f} tok per busy engine-s"
        if r.tails:
            line += f"; tail {r.tails}"
        lines.append(line)
    return lines


def engine_time_rows(summary: Mapping[str, Any]) -> list[EngineTimeRow]:
    """The run summary's breakdown rows (``agg`` and roles of every label)."""
    return _rows(summary, summary=True)


def engine_time_table(
    summary: Mapping[str, Any], title: str = "where the engines' time went"
) -> Any:
    """A rich table of :func:`engine_time_rows` (None when the summary has none)."""
    from rich.table import Table

    rows = engine_time_rows(summary)
    if not rows:
        return None
    t = Table(title=title, header_style="bold")
    t.add_column("label")
    t.add_column("scope")
    for p in PHASES:
        t.add_column(p, justify="right")
    t.add_column("engine-s", justify="right")
    t.add_column("tok/busy eng-s", justify="right")
    t.add_column("gen tok/s", justify="right")
    t.add_column("bottleneck")
    t.add_column("latency tail held by", overflow="fold")
    for r in rows:
        t.add_row(
            r.label,
            r.scope,
            *(_pct(v) for v in r.shares),
            "—" if r.engine_seconds is None else f"{r.engine_seconds:,.0f}",
            "—" if r.tokens_per_busy_second is None else f"{r.tokens_per_busy_second:,.1f}",
            "—" if r.tokens_per_second is None else f"{r.tokens_per_second:,.1f}",
            r.verdict,
            r.tails or "—",
        )
    return t
