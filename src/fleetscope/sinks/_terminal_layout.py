"""The terminal view's layout: figures as the view prints them, the columns a width holds,
the rows a height holds, the engine table and the one-line form of a poll."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetscope import catalog
from fleetscope.sinks._terminal_rows import EngineRow

if TYPE_CHECKING:
    from fleetscope.fleet.state import PollResult

NONE = "—"  # no figure


def num(v: float | None, fmt: str = "{:.1f}") -> str:
    return NONE if v is None else fmt.format(v)


def _si(v: float) -> str:
    """Three significant digits and a k / M / G / T suffix: 1156.1 -> ``1.16k``."""
    for suffix in ("k", "M", "G", "T"):
        v /= 1000.0
        if abs(v) < 999.5 or suffix == "T":
            text = f"{v:.2f}" if abs(v) < 9.995 else f"{v:.1f}" if abs(v) < 99.95 else f"{v:.0f}"
            return text + suffix
    raise AssertionError("unreachable")


def fmt_rate(v: float | None) -> str:
    """Tokens/s: one decimal below 1000, then compact (``146.7``, ``1.16k``, ``23.4k``)."""
    if v is None:
        return NONE
    return f"{v:.1f}" if abs(v) < 999.95 else _si(v)


def fmt_count(v: float | None) -> str:
    """Requests: whole below 10000, then compact (``9876``, ``12.3k``)."""
    if v is None:
        return NONE
    return f"{v:.0f}" if abs(v) < 9999.5 else _si(v)


def fmt_share(v: float | None) -> str:
    return num(v, "{:.0%}")


def fmt_seconds(v: float | None) -> str:
    """Seconds in at most five characters: ``0.046``, ``12.3``, ``184``, ``1234``."""
    if v is None:
        return NONE
    if abs(v) < 9.9995:
        return f"{v:.3f}"
    if abs(v) < 99.95:
        return f"{v:.1f}"
    return f"{v:.0f}" if abs(v) < 99999.5 else _si(v)


def fmt_quantile(per: Mapping[str, float], q: str) -> str:
    """A quantile in seconds; ``≥`` before it when its rank fell in ``+Inf`` (``{q}_clamped``):
    the figure is the highest finite bound, a floor of the true value."""
    text = fmt_seconds(per.get(q))
    return "≥" + text if per.get(q + "_clamped") else text


@dataclass(frozen=True, slots=True)
class Column:
    """A column of the engine table: its header (``short`` on a narrow terminal), its rank (the
    columns that matter most are kept first when the terminal is narrow; 0: always) and the
    width its figures usually take (so that the columns shown stay put from poll to poll)."""

    key: str
    header: str
    short: str
    rank: int
    right: bool = False
    width: int = 0


# in the order shown
COLUMNS: tuple[Column, ...] = (
    Column("engine", "engine", "engine", 0),
    Column("role", "role", "role", 9, width=7),
    Column("status", "status", "status", 0, width=7),
    Column("run", "run", "run", 2, True, 3),
    Column("wait", "wait", "wait", 3, True, 3),
    Column("KV", "KV", "KV", 4, True, 4),
    Column("gen", "gen tok/s", "gen/s", 1, True, 5),
    Column("prompt", "prompt tok/s", "prompt/s", 7, True, 5),
    Column("hit", "hit", "hit", 10, True, 4),
    Column("TTFT", "TTFT", "TTFT", 5, True, 5),
    Column("kind", "kind", "kind", 12, width=6),
    Column("weights", "weights", "weights", 11),
    Column("state", "state", "state", 6, width=7),
)
NUMERIC: frozenset[str] = frozenset(c.key for c in COLUMNS if c.right)
#: the marker of a figure that is its server's, shared by the server's DP replicas
SHARED_MARK = "*"


def row_cells(r: EngineRow) -> dict[str, str]:
    """The text of each cell of one engine's row."""
    return {
        "engine": r.engine_id,
        "role": r.role,
        "status": r.status,
        "run": fmt_count(r.running),
        "wait": fmt_count(r.waiting),
        "KV": fmt_share(r.kv),
        "gen": fmt_rate(r.gen_rate),
        "prompt": fmt_rate(r.prompt_rate),
        "hit": fmt_share(r.hit_rate),
        "TTFT": fmt_seconds(r.ttft) + (SHARED_MARK if r.ttft_shared else ""),
        "kind": r.kind,
        "weights": r.weights or "?",
        "state": r.state or NONE,
    }


def table_width(widths: list[int]) -> int:
    """The width of a rich table (heavy-head box, padding 1) with columns of these widths."""
    return sum(widths) + 3 * len(widths) + 1


def choose_columns(
    columns: list[Column], widths: Mapping[str, int], available: int, *, short: bool
) -> list[Column]:
    """The columns that fit in ``available`` characters, by rank (rank 0 always; the first
    that does not fit and every one after it left out), in the order shown. ``widths``: each
    column's width (its widest cell, at least its usual width)."""

    def width(c: Column) -> int:
        return max(widths.get(c.key, 0), len(c.short if short else c.header))

    kept: set[str] = set()
    used = table_width([])
    for c in sorted(columns, key=lambda c: c.rank):
        if c.rank and used + width(c) + 3 > available:
            break
        kept.add(c.key)
        used += width(c) + 3
    return [c for c in columns if c.key in kept]


@dataclass(frozen=True, slots=True)
class Layout:
    shown: list[Column]
    left_out: list[Column]
    short: bool

    def header(self, c: Column) -> str:
        return c.short if self.short else c.header


def layout(columns: list[Column], widths: Mapping[str, int], available: int) -> Layout:
    """The columns shown and their headers: the full headers when every column fits with them,
    else the short ones and as many columns as fit."""
    kept = choose_columns(columns, widths, available, short=False)
    short = len(kept) < len(columns)
    if short:
        kept = choose_columns(columns, widths, available, short=True)
    return Layout(kept, [c for c in columns if c not in kept], short)


def wrap_parts(parts: list[tuple[str, str]], width: int) -> list[list[tuple[str, str]]]:
    """(text, style) parts laid out in lines of at most ``width`` characters, two spaces
    apart, never breaking a part (a figure and its unit stay together)."""
    lines: list[list[tuple[str, str]]] = [[]]
    used = 0
    for text, style in parts:
        need = len(text) + (2 if lines[-1] else 0)
        if lines[-1] and used + need > width:
            lines.append([])
            used, need = 0, len(text)
        lines[-1].append((text, style))
        used += need
    return lines


def text_lines(parts: list[tuple[str, str]], width: int) -> Any:
    from rich.text import Text

    out = Text()
    for i, line in enumerate(wrap_parts(parts, width)):
        if i:
            out.append("\n")
        for j, (text, style) in enumerate(line):
            out.append(("  " if j else "") + text, style=style)
    return out


def column_in_use(c: Column, rows: list[EngineRow]) -> bool:
    """The RL loop's columns (docs/rl-lifecycle.md) when known: served weights, state."""
    if c.key == "weights":
        return any(r.weights for r in rows)
    if c.key == "state":
        return any(r.state for r in rows)
    return True


def layout_notes(lay: Layout, rows: list[EngineRow]) -> list[str]:
    """What a narrow terminal left out, and what a marked figure means."""
    notes = []
    if lay.left_out:
        notes.append("wider terminal shows: " + ", ".join(lay.header(c) for c in lay.left_out))
    if any(r.ttft_shared for r in rows) and any(c.key == "TTFT" for c in lay.shown):
        notes.append(
            f"TTFT{SHARED_MARK}: the server's, one tokenizer for all its SGLang DP replicas"
        )
    return notes


def fit_rows(rows: int, lines: int, event_lines: list[int]) -> tuple[int, int]:
    """How many engine rows and events fit in ``lines`` (the first event keeps its lines; at
    least one row; a "+N more" line when rows are left out; then as many events as fit)."""
    reserve = sum(event_lines[:1])
    shown = rows if rows <= lines - reserve else max(1, lines - reserve - 1)
    left = lines - shown - (1 if shown < rows else 0)
    k = 0
    while k < len(event_lines) and event_lines[k] <= left:
        left -= event_lines[k]
        k += 1
    return shown, k


def engine_table(
    lay: Layout, rows: list[EngineRow], cells: list[dict[str, str]], widths: Mapping[str, int]
) -> Any:
    """The engine table: each kept column as wide as its widest cell, never cut."""
    from rich.table import Table
    from rich.text import Text

    table = Table(show_lines=False, header_style="bold", expand=False)
    for c in lay.shown:
        table.add_column(
            lay.header(c),
            justify="right" if c.right else "left",
            no_wrap=True,
            min_width=max(widths.get(c.key, 0), len(lay.header(c))),
            # only the engine id, on a terminal too narrow for it and its status
            overflow="fold" if c.key == "engine" else "ellipsis",
        )
    for r, cell in zip(rows, cells, strict=True):
        style = {2: "bold red", 1: "yellow", 0: ""}[r.severity]
        styled = {
            "status": Text(r.status, style=style or "green"),
            "weights": Text(cell["weights"], style="yellow" if r.stale else ""),
            "state": Text(cell["state"], style="yellow" if r.state.isupper() else ""),
        }
        table.add_row(
            *(styled.get(c.key, cell[c.key]) for c in lay.shown),
            style=style if r.severity == 2 else None,
        )
    return table


def health_text(events: list[Any]) -> str:
    """``ok``, or how many health events and the first ones (condition and engine)."""
    if not events:
        return "ok"
    named = ", ".join(f"{e.condition} {e.subject}" for e in events[:4])
    return f"{len(events)}: {named}" + (f", +{len(events) - 4} more" if len(events) > 4 else "")


def poll_line(title: str, result: PollResult, rows: list[EngineRow]) -> str:
    """``fleetscope  poll 12  engines 8/8  gen 884.7 tok/s  run 24 wait 3  KV 16% max 23%
    TTFT p50 0.050 p99 0.099 s  health ok`` (or the events: ``health 1: generation_stalled
    decode0.0``). An endpoint that did not answer counts its engines as down (one if unknown)."""
    agg = result.stats.scopes.get("agg")
    am = agg.metrics if agg else {}

    def stat(metric: str, s: str) -> float | None:
        return am.get(metric, {}).get(s)

    up = sum(1 for r in rows if r.status != "NO DATA")
    info = getattr(result, "endpoint_info", {})
    down = sum(
        max(1, getattr(info.get(sc.endpoint), "engines", 0)) for sc in result.scrapes if not sc.ok
    )
    run, wait = fmt_count(stat(catalog.RUNNING, "sum")), fmt_count(stat(catalog.WAITING, "sum"))
    kv, kv_max = fmt_share(stat(catalog.KV_USAGE, "mean")), fmt_share(stat(catalog.KV_USAGE, "max"))
    ttft = am.get(catalog.TTFT, {})
    p50, p99 = fmt_quantile(ttft, "p50"), fmt_quantile(ttft, "p99")
    return "  ".join(
        (
            f"{title}  poll {result.step}",
            f"engines {up}/{up + down}",
            f"gen {fmt_rate(stat(catalog.GENERATION_RATE, 'sum'))} tok/s",
            f"run {run} wait {wait}",
            f"KV {kv} max {kv_max}",
            f"TTFT p50 {p50} p99 {p99} s",
            f"health {health_text(list(getattr(result, 'events', [])))}",
        )
    )
