"""A live terminal view of the fleet (rich): the fleet at a glance, engines sorted by health.

The sick engine is the first row, in red, with the reason. Works from the poll's statistics
(``log_poll``), so it shows every engine whatever the key schema or budget.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from fleetscope import catalog
from fleetscope.identity import endpoint_of
from fleetscope.sinks.base import Value

if TYPE_CHECKING:
    import logging

    from fleetscope.fleet.state import PollResult

KV_FULL = 0.95


@dataclass(frozen=True, slots=True)
class EngineRow:
    engine_id: str
    role: str
    status: str  # OK | STALLED | KV FULL | PREEMPTING | QUEUEING | NO DATA
    severity: int  # 2 red, 1 yellow, 0 fine
    running: float | None
    waiting: float | None
    kv: float | None
    gen_rate: float | None
    prompt_rate: float | None
    hit_rate: float | None
    ttft: float | None
    kind: str = "-"  # vLLM | SGLang | - (not known)
    weights: str = ""  # the served weight version ("" when versions are not in use)
    stale: bool = False  # it serves an older version than the trainer's
    state: str = ""  # serving | idle | stalled | PAUSED | ASLEEP | "" (unknown)
    #: ``ttft`` is its server's, shared by its DP replicas (SGLang's tokenizer families)
    ttft_shared: bool = False


def _f(m: Mapping[str, float], k: str) -> float | None:
    v = m.get(k)
    return None if v is None or math.isnan(v) else v


# health condition -> (status shown, severity)
STATUS: dict[str, tuple[str, int]] = {
    "generation_stalled": ("STALLED", 2),
    "engine_outlier": ("SLOW", 2),
    "kv_cache_near_full": ("KV FULL", 1),
    "preemption_burst": ("PREEMPTING", 1),
    "queue_growing": ("QUEUEING", 1),
}


def status_of(conditions: list[str]) -> tuple[str, int]:
    """The worst of an engine's health conditions (see fleetscope.health), or OK."""
    worst = ("OK", 0)
    for c in conditions:
        st = STATUS.get(c)
        if st is not None and st[1] > worst[1]:
            worst = st
    return worst


def _rl_cells(result: PollResult, endpoint: str, engine: str) -> dict[str, Any]:
    """The kind, weights and state cells of one engine (its endpoint's, docs/rl-lifecycle.md)."""
    from fleetscope.rl.view import KIND_NAMES

    info = getattr(result, "endpoint_info", {}).get(endpoint)
    if info is None:
        return {}
    asleep = None
    for inp in result.inputs:
        if inp.engine_id == engine:
            from fleetscope.rl.states import asleep_from_gauge

            asleep = asleep_from_gauge(inp.delta.current)
            break
    if asleep is None and info.engines and info.engines_asleep == info.engines:
        asleep = True
    state = "ASLEEP" if asleep else "PAUSED" if info.paused else ""
    if not state and (info.paused is not None or asleep is not None):
        state = "serving"
    weights = ""
    if info.version is not None:
        weights = info.version if not info.lag else f"{info.version} ({-info.lag:+d})"
    return {
        "kind": KIND_NAMES.get(info.kind or "", "-"),
        "weights": weights,
        "stale": bool(info.lag and info.lag > 0),
        "state": state,
    }


# SGLang's scheduler counts the tokens each DP replica processes, per mode, as it makes them
# (``realtime_tokens_total``); its tokenizer's prompt / generation / cached-token counters and
# latency histograms are one per server when DP > 1 (endpoint-level: docs/sglang.md)
_PREFILL_COMPUTE = "realtime_tokens_total{mode=prefill_compute}:rate"
_PREFILL_CACHE = "realtime_tokens_total{mode=prefill_cache}:rate"


def _prompt_and_hit(m: Mapping[str, float]) -> tuple[float | None, float | None]:
    """An engine's prompt tokens/s and prefix-cache hit rate: its own counters (vLLM, and an
    SGLang server with one replica), else its scheduler's prefill tokens, computed and cached."""
    prompt, hit = _f(m, catalog.PROMPT_RATE), _f(m, catalog.PREFIX_HIT_RATE)
    compute, cache = _f(m, _PREFILL_COMPUTE), _f(m, _PREFILL_CACHE)
    if compute is None and cache is None:
        return prompt, hit
    prefilled = (compute or 0.0) + (cache or 0.0)
    if hit is None and prefilled > 0:
        hit = (cache or 0.0) / prefilled
    return (prefilled if prompt is None else prompt), hit


def _activity(m: Mapping[str, float], conditions: list[str]) -> str:
    """What an engine is doing by its own figures: stalled, serving (requests running or
    waiting) or idle; "" when it reported neither gauge."""
    if "generation_stalled" in conditions:
        return "stalled"
    running, waiting = _f(m, catalog.RUNNING), _f(m, catalog.WAITING)
    if running is None and waiting is None:
        return ""
    return "serving" if (running or 0) > 0 or (waiting or 0) > 0 else "idle"


def _endpoint_figures(result: PollResult) -> dict[str, Mapping[str, float]]:
    """Each endpoint's own engine-less figures (an SGLang server's tokenizer with DP > 1)."""
    stats = result.stats
    return {
        endpoint_of(eid): stats.engine(eid)
        for i, eid in enumerate(stats.engine_ids)
        if not stats.is_engine[i]
    }


def _engine_row(
    result: PollResult,
    eid: str,
    role: str | None,
    conditions: list[str],
    shared: Mapping[str, float],
) -> EngineRow:
    """One engine's row: its own figures; its server's TTFT where it has none (marked)."""
    m = result.stats.engine(eid)
    status, sev = status_of(conditions)
    gen = next((v for k in catalog.DECODE_RATES if (v := _f(m, k)) is not None), None)
    prompt, hit = _prompt_and_hit(m)
    ttft = _f(m, catalog.TTFT + ":mean")
    ttft_shared = ttft is None and _f(shared, catalog.TTFT + ":mean") is not None
    if ttft_shared:
        ttft = _f(shared, catalog.TTFT + ":mean")
    cells = _rl_cells(result, endpoint_of(eid), eid)
    if cells.get("state") not in ("PAUSED", "ASLEEP"):
        cells["state"] = _activity(m, conditions) or cells.get("state", "")
    return EngineRow(
        eid,
        role or "-",
        status,
        sev,
        _f(m, catalog.RUNNING),
        _f(m, catalog.WAITING),
        _f(m, catalog.KV_USAGE),
        gen,
        prompt,
        hit,
        ttft,
        ttft_shared=ttft_shared,
        **cells,
    )


def engine_rows(result: PollResult, roles: Mapping[str, str | None]) -> list[EngineRow]:
    """Every engine of the poll, and one NO DATA row per endpoint that did not answer; the
    sickest first."""
    stats = result.stats
    rows: list[EngineRow] = []
    conditions: dict[str, list[str]] = {}
    for ev in getattr(result, "events", []):
        conditions.setdefault(ev.subject, []).append(ev.condition)
    shared = _endpoint_figures(result)
    for i, eid in enumerate(stats.engine_ids):
        if not stats.is_engine[i]:
            continue
        role = roles.get(eid, roles.get(endpoint_of(eid)))
        ep = endpoint_of(eid)
        rows.append(_engine_row(result, eid, role, conditions.get(eid, []), shared.get(ep, {})))
    for sc in result.scrapes:
        if not sc.ok:
            cells = _rl_cells(result, sc.endpoint, "")
            cells.pop("state", None)  # not observed this poll
            rows.append(
                EngineRow(sc.endpoint + ".*", sc.role or "-", "NO DATA", 2, *(None,) * 7, **cells)
            )
    rows.sort(key=lambda r: (-r.severity, r.engine_id))
    return rows


# (metric, stat) of the fleet-wide scope that the terminal's run summary shows
SUMMARY_HEADLINES: frozenset[tuple[str, str]] = frozenset(
    {
        (catalog.GENERATION_TOKENS, "delta"),
        (catalog.PROMPT_TOKENS, "delta"),
        (catalog.REQUEST_SUCCESS, "delta"),
        (catalog.PREEMPTIONS, "delta"),
        (catalog.GENERATION_RATE, "sum"),
        (catalog.PROMPT_RATE, "sum"),
        (catalog.PREFIX_HIT_RATE, "pooled"),
        (catalog.TTFT, "p90"),
        (catalog.TPOT, "p90"),
    }
)


def _summary_headline(key: str) -> bool:
    """``run_status``, a run label's own keys (``{root}/{label}/coverage``, SkyRL's
    ``vllm_correct_aggregate/{label}/output_tokens_total``) and the headline ``agg`` stats."""
    parts = key.split("/")
    if len(parts) <= 3:
        return True
    return len(parts) == 5 and parts[2] == "agg" and (parts[3], parts[4]) in SUMMARY_HEADLINES


NONE = "—"  # no figure


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
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
    return _num(v, "{:.0%}")


def fmt_seconds(v: float | None) -> str:
    """Seconds in at most five characters: ``0.046``, ``12.3``, ``184``, ``1234``."""
    if v is None:
        return NONE
    if abs(v) < 9.9995:
        return f"{v:.3f}"
    if abs(v) < 99.95:
        return f"{v:.1f}"
    return f"{v:.0f}" if abs(v) < 99999.5 else _si(v)


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


def _text_lines(parts: list[tuple[str, str]], width: int) -> Any:
    from rich.text import Text

    out = Text()
    for i, line in enumerate(wrap_parts(parts, width)):
        if i:
            out.append("\n")
        for j, (text, style) in enumerate(line):
            out.append(("  " if j else "") + text, style=style)
    return out


def _column_in_use(c: Column, rows: list[EngineRow]) -> bool:
    """The RL loop's columns (docs/rl-lifecycle.md) when known: served weights, state."""
    if c.key == "weights":
        return any(r.weights for r in rows)
    if c.key == "state":
        return any(r.state for r in rows)
    return True


def _notes(lay: Layout, rows: list[EngineRow]) -> list[str]:
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


def _table(
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


def _health_text(events: list[Any]) -> str:
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
    p50, p99 = fmt_seconds(stat(catalog.TTFT, "p50")), fmt_seconds(stat(catalog.TTFT, "p99"))
    return "  ".join(
        (
            f"{title}  poll {result.step}",
            f"engines {up}/{up + down}",
            f"gen {fmt_rate(stat(catalog.GENERATION_RATE, 'sum'))} tok/s",
            f"run {run} wait {wait}",
            f"KV {kv} max {kv_max}",
            f"TTFT p50 {p50} p99 {p99} s",
            f"health {_health_text(list(getattr(result, 'events', [])))}",
        )
    )


class TerminalSink:
    """Renders a live table with rich, as wide as the terminal. ``live=False`` prints one table
    per poll instead; ``compact`` one line per poll (the default when ``live`` is not given
    and the output is not a terminal: a file or a pipe gets no repeated tables)."""

    def __init__(
        self,
        *,
        file: IO[str] | None = None,
        live: bool | None = None,
        title: str = "fleetscope",
        max_rows: int = 40,
        compact: bool | None = None,
    ):
        from rich.console import Console

        self.console = Console(file=file or sys.stdout)
        self.live = self.console.is_terminal if live is None else live
        self.compact = (live is None and not self.live) if compact is None else compact
        self.title = title
        self.max_rows = max_rows
        self._live: Any = None
        # (logging handler, its own stream) while the view is live
        self._log_swaps: list[tuple[logging.StreamHandler[IO[str]], IO[str]]] = []
        self._lock = threading.Lock()
        self.summary: dict[str, Value] = {}
        self.last_rows: list[EngineRow] = []

    def render(self, result: PollResult, roles: Mapping[str, str | None] | None = None) -> Any:
        """One frame: the fleet's headline, the engine table (the columns the console's width
        holds, the rows its height holds when live) and the health events."""
        from rich.text import Text

        if roles is None:
            roles = {sc.endpoint: sc.role for sc in result.scrapes}
            roles.update({i.engine_id: i.role for i in result.inputs})
        rows = engine_rows(result, roles)
        self.last_rows = rows
        width = self.console.width
        head = _text_lines(self._head_parts(result, rows), width)
        events = [
            Text(f"  ! {e.condition}: {e.message}", style="bold red")
            for e in getattr(result, "events", [])[:8]
        ]
        return self._frame(head, rows, events, width)

    def _head_parts(self, result: PollResult, rows: list[EngineRow]) -> list[tuple[str, str]]:
        """The fleet at a glance: endpoints answering, engines, token rates, TTFT, sick."""
        agg = result.stats.scopes.get("agg")
        am = agg.metrics if agg else {}

        def stat(metric: str, s: str) -> float | None:
            return am.get(metric, {}).get(s)

        ok = sum(1 for sc in result.scrapes if sc.ok)
        sick = sum(1 for r in rows if r.severity == 2)
        parts = [
            (self.title, "bold"),
            (f"poll {result.step}", ""),
            (
                f"endpoints {ok}/{len(result.scrapes)}",
                "green" if ok == len(result.scrapes) else "red",
            ),
            (f"engines {agg.engines if agg else 0}", ""),
            (f"gen {fmt_rate(stat(catalog.GENERATION_RATE, 'sum'))} tok/s", ""),
            (f"prompt {fmt_rate(stat(catalog.PROMPT_RATE, 'sum'))} tok/s", ""),
            (f"hit {_num(stat(catalog.PREFIX_HIT_RATE, 'pooled'), '{:.1%}')}", ""),
            (f"TTFT p90 {fmt_seconds(stat(catalog.TTFT, 'p90'))} s", ""),
            (f"{sick} sick", "bold red") if sick else ("all healthy", "green"),
        ]
        held = sum(1 for r in rows if r.state in ("PAUSED", "ASLEEP"))
        stale = sum(1 for r in rows if r.stale)
        if held or stale:
            parts.append((f"{held} paused/asleep  {stale} on old weights", "yellow"))
        return parts

    def _frame(self, head: Any, rows: list[EngineRow], events: list[Any], width: int) -> Any:
        """The head, the table of the rows that fit, what was left out, and the events."""
        from rich.console import Group
        from rich.text import Text

        listed = rows[: self.max_rows]
        cells = [row_cells(r) for r in listed]
        columns = [c for c in COLUMNS if _column_in_use(c, listed)]
        widths = {c.key: max([c.width, *(len(cell[c.key]) for cell in cells)]) for c in columns}
        lay = layout(columns, widths, width)
        notes = [Text(n, style="dim") for n in _notes(lay, listed)]
        n, k = len(listed), len(events)
        if self.live:
            fixed = [head, *notes]
            n, k = fit_rows(
                len(listed),
                self.console.height - 1 - 4 - sum(self._lines(t, width) for t in fixed),
                [self._lines(e, width) for e in events],
            )
        parts: list[Any] = [head, _table(lay, listed[:n], cells[:n], widths), *notes]
        if n < len(rows):
            why = "a taller terminal shows them" if self.live else f"max_rows={self.max_rows}"
            parts.append(Text(f"+{len(rows) - n} more engines: {why} (sick ones first)"))
        return Group(*parts, *events[:k])

    def _lines(self, text: Any, width: int) -> int:
        """The lines a Text takes on the console at ``width``."""
        return len(text.wrap(self.console, width))

    def log_line(self, result: PollResult) -> str:
        """One poll in one line (stdout is not a terminal): step, engines answering, token
        rate, requests, KV usage, TTFT and the health events."""
        rows = engine_rows(result, {})
        self.last_rows = rows
        return poll_line(self.title, result, rows)

    def log_poll(self, result: PollResult) -> None:
        if self.compact and not self.live:
            line = self.log_line(result)
            with self._lock:
                self.console.print(line, soft_wrap=True, markup=False, highlight=False)
            return
        if self.live and self._live is not None and result.held:
            return  # a held row has no rates: the view keeps the last figures it showed
        renderable = self.render(result)
        with self._lock:
            if self.live:
                if self._live is None:
                    from rich.live import Live

                    self._live = Live(renderable, console=self.console, auto_refresh=False)
                    self._live.start()
                    self._redirect_log_handlers()
                self._live.update(renderable, refresh=True)
            else:
                self.console.print(renderable)

    def log(self, metrics: Mapping[str, Value], *, step: int, wall_time: float) -> None:
        """Keys alone carry no per-engine table; the collector calls :meth:`log_poll`."""

    def log_summary(self, summary: Mapping[str, Value]) -> None:
        """Print the headline of the run summary (the full one has thousands of keys: it
        goes to the other sinks; all of it is kept in ``self.summary``)."""
        from rich.table import Table

        self.summary.update(summary)
        shown = {k: v for k, v in summary.items() if _summary_headline(k)}
        table = Table(title="run summary", header_style="bold")
        table.add_column("key", overflow="fold")
        table.add_column("value", justify="right", no_wrap=True)
        for k, v in shown.items():
            table.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
        if len(shown) < len(summary):
            table.caption = f"{len(shown)} of {len(summary)} keys; all of them in the other sinks"
        with self._lock:
            self._stop_live()
            self.console.print(table)

    def _redirect_log_handlers(self) -> None:
        """Point logging's stream handlers at rich's stdout/stderr proxies while the view is live.

        A handler made by ``logging.basicConfig`` holds the real ``sys.stderr``, so its records
        bypass the redirection ``Live`` installs and land inside the view, which then redraws
        from the wrong line and leaves torn frames on screen. Through the proxy they are
        printed above the view. Undone by :meth:`_stop_live`.
        """
        import logging

        managed = logging.Logger.manager.loggerDict.values()
        loggers = [logging.getLogger(), *(lg for lg in managed if isinstance(lg, logging.Logger))]
        for proxy in (sys.stdout, sys.stderr):
            original = getattr(proxy, "rich_proxied_file", None)
            if original is None:
                continue
            for lg in loggers:
                for h in lg.handlers:
                    if type(h) is logging.StreamHandler and h.stream is original:
                        h.setStream(proxy)
                        self._log_swaps.append((h, original))

    def _stop_live(self) -> None:
        for h, original in self._log_swaps:
            h.setStream(original)
        self._log_swaps.clear()
        if self._live is not None:
            self._live.stop()
            self._live = None

    def close(self) -> None:
        with self._lock:
            self._stop_live()
