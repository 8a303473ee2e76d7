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
    state: str = ""  # serving | PAUSED | ASLEEP | "" (unknown)


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


def engine_rows(result: PollResult, roles: Mapping[str, str | None]) -> list[EngineRow]:
    stats = result.stats
    rows: list[EngineRow] = []
    conditions: dict[str, list[str]] = {}
    for ev in getattr(result, "events", []):
        conditions.setdefault(ev.subject, []).append(ev.condition)
    for i, eid in enumerate(stats.engine_ids):
        if not stats.is_engine[i]:
            continue
        m = stats.engine(eid)
        role = roles.get(eid, roles.get(endpoint_of(eid)))
        status, sev = status_of(conditions.get(eid, []))
        rows.append(
            EngineRow(
                eid,
                role or "-",
                status,
                sev,
                _f(m, catalog.RUNNING),
                _f(m, catalog.WAITING),
                _f(m, catalog.KV_USAGE),
                _f(m, catalog.GENERATION_RATE),
                _f(m, catalog.PROMPT_RATE),
                _f(m, catalog.PREFIX_HIT_RATE),
                _f(m, catalog.TTFT + ":mean"),
                **_rl_cells(result, endpoint_of(eid), eid),
            )
        )
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


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


class TerminalSink:
    """Renders a live table with rich. ``live=False`` prints one table per poll instead."""

    def __init__(
        self,
        *,
        file: IO[str] | None = None,
        live: bool | None = None,
        title: str = "fleetscope",
        max_rows: int = 40,
    ):
        from rich.console import Console

        self.console = Console(file=file or sys.stdout)
        self.live = self.console.is_terminal if live is None else live
        self.title = title
        self.max_rows = max_rows
        self._live: Any = None
        # (logging handler, its own stream) while the view is live
        self._log_swaps: list[tuple[logging.StreamHandler[IO[str]], IO[str]]] = []
        self._lock = threading.Lock()
        self.summary: dict[str, Value] = {}
        self.last_rows: list[EngineRow] = []

    def render(self, result: PollResult, roles: Mapping[str, str | None] | None = None) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        if roles is None:
            roles = {sc.endpoint: sc.role for sc in result.scrapes}
            roles.update({i.engine_id: i.role for i in result.inputs})
        rows = engine_rows(result, roles)
        self.last_rows = rows
        agg = result.stats.scopes.get("agg")
        am = agg.metrics if agg else {}

        def stat(metric: str, s: str) -> float | None:
            return am.get(metric, {}).get(s)

        ok = sum(1 for sc in result.scrapes if sc.ok)
        all_ok = ok == len(result.scrapes)
        sick = [r for r in rows if r.severity == 2]
        head = Text.assemble(
            (f"{self.title}  ", "bold"),
            f"poll {result.step}  ",
            (
                f"endpoints {ok}/{len(result.scrapes)}  ",
                "green" if all_ok else "red",
            ),
            f"engines {agg.engines if agg else 0}  ",
            f"gen {_num(stat('generation_tokens_total:rate', 'sum'))} tok/s  ",
            f"prompt {_num(stat('prompt_tokens_total:rate', 'sum'))} tok/s  ",
            f"hit {_num(stat('prefix_cache_hit_rate', 'pooled'), '{:.1%}')}  ",
            f"TTFT p90 {_num(stat('time_to_first_token_seconds', 'p90'), '{:.3f}')} s  ",
            (f"{len(sick)} sick" if sick else "all healthy", "bold red" if sick else "green"),
        )
        held = sum(1 for r in rows if r.state in ("PAUSED", "ASLEEP"))
        stale = sum(1 for r in rows if r.stale)
        if held or stale:
            head.append(f"  {held} paused/asleep  {stale} on old weights", style="yellow")
        table = Table(show_lines=False, header_style="bold", expand=False)
        for col, just in (
            ("engine", "left"),
            ("role", "left"),
            ("status", "left"),
            ("run", "right"),
            ("wait", "right"),
            ("KV", "right"),
            ("gen tok/s", "right"),
            ("prompt tok/s", "right"),
            ("hit", "right"),
            ("TTFT", "right"),
            ("kind", "left"),
        ):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        # the RL loop (docs/rl-lifecycle.md): served weights and paused / asleep, when known
        show_weights = any(r.weights for r in rows)
        show_state = any(r.state for r in rows)
        if show_weights:
            table.add_column("weights", justify="left")
        if show_state:
            table.add_column("state", justify="left")
        # the engine id is what the operator acts on: never cut it ("serve…") on a narrow
        # console (80 columns when piped); the numeric columns wrap instead
        id_width = max((len(r.engine_id) for r in rows[: self.max_rows]), default=6)
        table.columns[0].no_wrap = True
        table.columns[0].min_width = id_width
        table.columns[2].no_wrap = True
        table.columns[2].min_width = max(len(r.status) for r in rows) if rows else 6
        for r in rows[: self.max_rows]:
            style = {2: "bold red", 1: "yellow", 0: ""}[r.severity]
            extra: list[Any] = []
            if show_weights:
                extra.append(Text(r.weights or "?", style="yellow" if r.stale else ""))
            if show_state:
                extra.append(Text(r.state or "?", style="yellow" if r.state.isupper() else ""))
            table.add_row(
                r.engine_id,
                r.role,
                Text(r.status, style=style or "green"),
                _num(r.running, "{:.0f}"),
                _num(r.waiting, "{:.0f}"),
                _num(r.kv, "{:.0%}"),
                _num(r.gen_rate),
                _num(r.prompt_rate),
                _num(r.hit_rate, "{:.0%}"),
                _num(r.ttft, "{:.3f}"),
                r.kind,
                *extra,
                style=style if r.severity == 2 else None,
            )
        if len(rows) > self.max_rows:
            table.caption = f"{len(rows) - self.max_rows} more engines"
        events = [
            Text(f"  ! {e.condition}: {e.message}", style="bold red")
            for e in getattr(result, "events", [])[:8]
        ]
        return Group(head, table, *events)

    def log_poll(self, result: PollResult) -> None:
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
