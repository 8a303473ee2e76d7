"""A live terminal view of the fleet (rich): the fleet at a glance, engines sorted by health.

The sick engine is the first row, in red, with the reason. Works from the poll's statistics
(``log_poll``), so it shows every engine whatever the key schema or budget.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

from fleetscope import catalog
from fleetscope.sinks._terminal_breakdown import (
    EngineTimeRow,
    engine_time_rows,
    engine_time_table,
    window_lines,
)
from fleetscope.sinks._terminal_layout import (
    COLUMNS,
    column_in_use,
    engine_table,
    fit_rows,
    fmt_count,
    fmt_quantile,
    fmt_rate,
    fmt_seconds,
    layout,
    layout_notes,
    num,
    poll_line,
    row_cells,
    text_lines,
)
from fleetscope.sinks._terminal_rows import STATUS, EngineRow, engine_rows, summary_headline
from fleetscope.sinks.base import Value

if TYPE_CHECKING:
    import logging

    from fleetscope.fleet.state import PollResult

# what the view's tests and users read beside the sink
__all__ = [
    "COLUMNS",
    "STATUS",
    "EngineRow",
    "EngineTimeRow",
    "TerminalSink",
    "engine_rows",
    "engine_time_rows",
    "engine_time_table",
    "fit_rows",
    "fmt_count",
    "fmt_rate",
    "fmt_seconds",
    "poll_line",
    "row_cells",
    "window_lines",
]


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
        head = text_lines(self._head_parts(result, rows), width)
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
            (f"hit {num(stat(catalog.PREFIX_HIT_RATE, 'pooled'), '{:.1%}')}", ""),
            (f"TTFT p90 {fmt_quantile(am.get(catalog.TTFT, {}), 'p90')} s", ""),
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
        columns = [c for c in COLUMNS if column_in_use(c, listed)]
        widths = {c.key: max([c.width, *(len(cell[c.key]) for cell in cells)]) for c in columns}
        lay = layout(columns, widths, width)
        notes = [Text(n, style="dim") for n in layout_notes(lay, listed)]
        n, k = len(listed), len(events)
        if self.live:
            fixed = [head, *notes]
            n, k = fit_rows(
                len(listed),
                self.console.height - 1 - 4 - sum(self._lines(t, width) for t in fixed),
                [self._lines(e, width) for e in events],
            )
        parts: list[Any] = [head, engine_table(lay, listed[:n], cells[:n], widths), *notes]
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
        windows = window_lines(result.keys)  # the windows that stopped at this poll
        if self.compact and not self.live:
            line = self.log_line(result)
            with self._lock:
                for text in (line, *windows):
                    self.console.print(text, soft_wrap=True, markup=False, highlight=False)
            return
        if windows:
            with self._lock:  # above the live view, which keeps redrawing below them
                for text in windows:
                    self.console.print(text, soft_wrap=True, markup=False, highlight=False)
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
        shown = {k: v for k, v in summary.items() if summary_headline(k)}
        table = Table(title="run summary", header_style="bold")
        table.add_column("key", overflow="fold")
        table.add_column("value", justify="right", no_wrap=True)
        for k, v in shown.items():
            table.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
        if len(shown) < len(summary):
            table.caption = f"{len(shown)} of {len(summary)} keys; all of them in the other sinks"
        breakdown = engine_time_table(summary)
        with self._lock:
            self._stop_live()
            self.console.print(table)
            if breakdown is not None:
                self.console.print(breakdown)

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
