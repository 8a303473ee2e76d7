"""The terminal view's layout: the columns the console's width holds (the sick engines and the
figures that matter first, never a cut number, the left-out columns named), the rows its height
holds ("+N more", sick engines first), one line per poll when the output is not a terminal,
an SGLang server's DP replicas with their own figures, and each engine's state."""

from __future__ import annotations

import io
import re
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx
import pytest

from fleetscope import catalog
from fleetscope.collector.core import Collector
from fleetscope.fleet.state import PollResult
from fleetscope.identity import Role
from fleetscope.sinks.terminal import (
    COLUMNS,
    EngineRow,
    TerminalSink,
    engine_rows,
    fit_rows,
    fmt_count,
    fmt_rate,
    fmt_seconds,
)
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet

#: a figure as the view prints it: 146.7, 1.16k, 21%, 0.046, 0.046* (its server's), or none
NUMBER = re.compile(r"^(—|-?\d+(\.\d+)?[kMGT]?%?\*?)$")
HEADERS = {h: c for c in COLUMNS for h in (c.header, c.short)}
#: the demo's mixed fleet: server1 is an SGLang server with two DP replicas
MIXED: list[tuple[Role | None, str]] = [
    (None, "vllm"),
    (None, "sglang"),
    ("prefill", "vllm"),
    ("decode", "vllm"),
]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def served(
    kinds: list[tuple[Role | None, str]], *, dp: int = 2, down: int = 0
) -> AsyncIterator[tuple[SimFleet, FleetServer, Collector]]:
    """A busy simulated fleet on loopback (and ``down`` endpoints nobody answers), polled once
    by a collector that polls only when asked."""
    fleet = SimFleet(seed=5)
    for role, kind in kinds:
        fleet.add_endpoint(role=role, dp=dp, engine_kind=kind)
    fleet.step(3.0)
    with FleetServer(fleet) as server:
        endpoints = [Endpoint(server.url(ep.name), ep.name, ep.role) for ep in fleet.endpoints] + [
            Endpoint(f"http://127.0.0.1:{closed_port()}", f"gone{i}") for i in range(down)
        ]
        c = Collector(endpoints, interval=3600.0, timeout=5.0, fetch_model_info=False)
        try:
            await c.poll()
            yield fleet, server, c
        finally:
            await c.stop(timeout=10.0)


async def next_poll(fleet: SimFleet, c: Collector) -> PollResult:
    """One simulated second, then a poll: every engine's counters moved since the last one."""
    fleet.step(1.0)
    return (await c.poll()).result


def screen(result: PollResult, width: int, height: int | None = None) -> str:
    """The frame at ``width`` (and, live, at ``height``)."""
    out = io.StringIO()
    sink = TerminalSink(file=out, live=height is not None)
    sink.console.width = width
    if height is not None:
        sink.console.height = height
    sink.console.print(sink.render(result))
    return out.getvalue()


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and the body rows of the (last) engine table of a frame."""
    header: list[str] = []
    rows: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("┃"):
            header, rows = [c.strip() for c in line.strip("┃").split("┃")], []
        elif line.startswith("│"):
            rows.append([c.strip() for c in line.strip("│").split("│")])
    return header, rows


def check_frame(text: str, width: int, engine_ids: set[str]) -> dict[str, dict[str, str]]:
    """No line wider than the console; no cut cell; every figure parses; every engine shown
    once (else a "+N more" line counts the rest); the left-out columns named. The cells of
    each engine, by header."""
    assert all(len(line) <= width for line in text.splitlines()), text
    assert "…" not in text and "..." not in text, text
    header, rows = table(text)
    assert header[:1] == ["engine"] and "status" in header, text
    cells = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
    assert len(cells) == len(rows), text
    for row in cells.values():
        for h, v in row.items():
            if HEADERS[h].right:
                assert NUMBER.match(v), (h, v, text)
    more = re.search(r"^\+(\d+) more engines", text, re.M)
    assert set(cells) <= engine_ids, text
    assert len(cells) + (int(more[1]) if more else 0) == len(engine_ids), text
    shown = {HEADERS[h].key for h in header}
    left_out = [c.short for c in COLUMNS if c.key not in shown and c.key != "weights"]
    if left_out:
        assert f"wider terminal shows: {', '.join(left_out)}" in " ".join(text.split()), text
    else:
        assert "wider terminal shows" not in text, text
    return cells


def test_figures_are_compact_and_never_wider_than_their_column() -> None:
    assert [fmt_rate(v) for v in (0.0, 146.74, 999.94, 999.96, 1156.1, 12345, 123456)] == [
        "0.0",
        "146.7",
        "999.9",
        "1.00k",
        "1.16k",
        "12.3k",
        "123k",
    ]
    assert [fmt_rate(v) for v in (999_600, 2.5e9, None)] == ["1.00M", "2.50G", "—"]
    assert [fmt_count(v) for v in (3, 9999, 12345)] == ["3", "9999", "12.3k"]
    assert [fmt_seconds(v) for v in (0.0456, 9.9994, 12.34, 184.2)] == [
        "0.046",
        "9.999",
        "12.3",
        "184",
    ]
    for v in (0.0, 0.5, 7.25, 99.94, 999.5, 1e4, 3.3e5, 9.99e6, 7e8, 4e11):
        assert len(fmt_rate(v)) <= 5 and len(fmt_seconds(v)) <= 5, v


def test_rows_and_events_share_the_height() -> None:
    assert fit_rows(8, 20, [1, 1, 1]) == (8, 3)  # all of it
    assert fit_rows(8, 10, [1, 1, 1]) == (8, 2)
    assert fit_rows(8, 8, [1, 1, 1]) == (6, 1)  # the first event kept, a "+N more" line
    assert fit_rows(30, 5, [2, 2]) == (2, 1)
    assert fit_rows(30, 2, [2, 2]) == (1, 0)  # at least one row
    assert fit_rows(3, 6, [2, 2, 2]) == (3, 1)


async def test_sglang_dp_replicas_show_their_own_figures() -> None:
    """SGLang with DP > 1: the tokenizer's counters and histograms (prompt / generation tokens,
    cached tokens, TTFT) are one per server, kept as the endpoint's engine-less row; the view
    read only each engine's own row, so every figure but the scheduler's gauges was "—". Each
    replica's token rates and hit rate now come from its scheduler's ``realtime_tokens_total``
    (per mode, counted as tokens are made) and its TTFT is its server's, marked."""
    async with served(MIXED) as (fleet, _server, c):
        result = await next_poll(fleet, c)
    stats = result.stats
    rows = {r.engine_id: r for r in engine_rows(result, {})}
    sglang = [e for e in rows if e.startswith("server1.")]
    assert sorted(sglang) == ["server1.0", "server1.1"]
    server = stats.engine("server1")  # the endpoint's own row: its tokenizer's families
    ttft = server[catalog.TTFT + ":mean"]
    for eid in sglang:
        r, m = rows[eid], stats.engine(eid)
        assert catalog.GENERATION_RATE not in m and catalog.TTFT + ":mean" not in m
        assert r.kind == "SGLang"
        assert r.gen_rate == m["realtime_tokens_total{mode=decode}:rate"]
        compute = m["realtime_tokens_total{mode=prefill_compute}:rate"]
        cache = m["realtime_tokens_total{mode=prefill_cache}:rate"]
        assert r.prompt_rate == pytest.approx(compute + cache)
        assert r.hit_rate == pytest.approx(cache / (compute + cache))
        assert (r.ttft, r.ttft_shared) == (ttft, True)
    assert sum(rows[e].gen_rate or 0.0 for e in sglang) > 0
    for eid, r in rows.items():
        if not eid.startswith("server1."):  # vLLM: each engine's own counters, as before
            m = stats.engine(eid)
            assert (r.gen_rate, r.prompt_rate) == (
                m[catalog.GENERATION_RATE],
                m[catalog.PROMPT_RATE],
            )
            assert r.ttft == m.get(catalog.TTFT + ":mean") and not r.ttft_shared
    for width in (80, 160):
        cells = check_frame(screen(result, width), width, set(rows))
        for eid in sglang:
            assert cells[eid]["gen tok/s" if width == 160 else "gen/s"] not in ("—", "0.0")
            assert cells[eid]["TTFT"] == f"{ttft:.3f}*"
        assert "TTFT*: the server's" in screen(result, width)


async def test_every_engine_has_a_state_sglang_too() -> None:
    """The demo's mixed fleet showed ``?`` as the state of its SGLang engines: the state came
    only from vLLM's sleep gauge and the /is_paused probe. It now says what the engine does:
    serving, idle, stalled, or PAUSED / ASLEEP when the RL loop holds it."""
    async with served(MIXED) as (fleet, server, c):
        result = await next_poll(fleet, c)
        rows = {r.engine_id: r for r in engine_rows(result, {})}
        assert {r.state for r in rows.values()} <= {"serving", "idle"}, rows
        assert rows["server1.0"].state == rows["server1.1"].state == "serving"
        for eid in ("server1.0", "server1.1"):
            text = screen(result, 160)
            assert re.search(rf"│ {re.escape(eid)} .*│ SGLang │ serving │$", text, re.M), text
        c.set_policy_version("v0")  # RL in use: the collector asks each server /is_paused
        async with httpx.AsyncClient() as h:
            await h.post(server.url("server1") + "/pause")
        for _ in range(5):  # the answer is the probe's latest: a poll or two later
            result = await next_poll(fleet, c)
            rows = {r.engine_id: r for r in engine_rows(result, {})}
            if rows["server1.0"].state != "serving":
                break
    # without vLLM's sleep gauge, a paused server also answers /is_sleeping true: the collector
    # counts its engines asleep (fleetscope.rl.states)
    assert rows["server1.0"].state == rows["server1.1"].state == "ASLEEP"
    assert rows["server0.0"].state == "serving"
    assert "?" not in {r.state for r in rows.values()}


def test_the_state_says_stalled_on_a_stalled_engine() -> None:
    from fleetscope.sinks._terminal_rows import _activity

    m = {catalog.RUNNING: 0.0, catalog.WAITING: 0.0}
    assert _activity(m, []) == "idle"
    assert _activity({**m, catalog.WAITING: 2.0}, []) == "serving"
    assert _activity(m, ["generation_stalled"]) == "stalled"
    assert _activity({}, []) == ""


async def test_columns_follow_the_width() -> None:
    """Narrow: the lower-ranked columns go (named in a caption), the short headers are used,
    no figure is cut; wide: every column with its full header."""
    async with served(MIXED) as (fleet, _server, c):
        result = await next_poll(fleet, c)
    ids = {r.engine_id for r in engine_rows(result, {})}
    shown = []
    for width in (40, 60, 80, 100, 120, 160, 200):
        text = screen(result, width)
        check_frame(text, width, ids)
        header, _ = table(text)
        shown.append(len(header))
        if width >= 160:
            assert "gen tok/s" in header and "prompt tok/s" in header, text
        if width <= 80:
            assert "gen/s" in header, text
    assert shown == sorted(shown) and shown[0] == 4 and shown[-1] == 12  # engine, status, gen, run
    at_80, _ = table(screen(result, 80))
    assert at_80 == ["engine", "status", "run", "wait", "KV", "gen/s", "TTFT", "state"]


async def test_rows_are_limited_by_the_height_and_say_so_sick_first() -> None:
    async with served([(None, "vllm")] * 6, dp=4, down=1) as (fleet, _server, c):
        result = await next_poll(fleet, c)
    ids = {r.engine_id for r in engine_rows(result, {})}
    assert len(ids) == 25
    for width, height in ((80, 24), (120, 30), (160, 48)):
        text = screen(result, width, height)
        assert len(text.splitlines()) < height, text
        cells = check_frame(text, width, ids)
        assert next(iter(cells)) == "gone0.*", text  # the sick one first
        assert cells["gone0.*"]["status"] == "NO DATA"
        if len(cells) < len(ids):
            assert f"+{len(ids) - len(cells)} more engines: a taller terminal shows them" in text
    assert len(check_frame(screen(result, 160, 48), 160, ids)) == 25
    # not live (``--once``, ``--no-tui``): every engine up to max_rows
    assert len(check_frame(screen(result, 80), 80, ids)) == 25


async def test_not_a_terminal_one_line_per_poll() -> None:
    """A file or a pipe gets one line per poll (not a table each time), then the summary."""
    out = io.StringIO()
    sink = TerminalSink(file=out)
    assert (sink.live, sink.compact) == (False, True)
    assert TerminalSink(file=io.StringIO(), live=False).compact is False  # tables, as asked
    async with served(MIXED, down=1) as (fleet, _server, c):
        for _ in range(3):
            sink.log_poll(await next_poll(fleet, c))
    sink.log_summary({"inference_summary/agg/coverage": 1.0, "run_status": "success"})
    lines = out.getvalue().splitlines()
    polls = [ln for ln in lines if ln.startswith("fleetscope  poll ")]
    assert lines[: len(polls)] == polls and len(polls) == 3, out.getvalue()
    line = re.compile(
        r"^fleetscope  poll (\d+)  engines (\d+)/(\d+)  gen \S+ tok/s  run \d+ wait \d+  "
        r"KV \d+% max \d+%  TTFT p50 [\d.]+ p99 [\d.]+ s  health (ok|\d+: .+)$"
    )
    parsed = [line.match(p) for p in polls]
    assert all(parsed), polls
    assert [int(m[1]) for m in parsed if m] == [1, 2, 3]
    assert {(m[2], m[3]) for m in parsed if m} == {("8", "9")}  # gone0: one engine, down
    assert "run summary" in out.getvalue() and "┃" not in "\n".join(polls)


def test_an_engine_row_without_figures_shows_none() -> None:
    from fleetscope.sinks.terminal import row_cells

    cells = row_cells(EngineRow("x.*", "-", "NO DATA", 2, *(None,) * 7))
    assert {cells[c.key] for c in COLUMNS if c.right} == {"—"}
    assert cells["state"] == "—"


async def test_the_live_view_keeps_its_figures_over_a_held_row() -> None:
    """A held row (a boundary, a poll moments after another: docs/rules.md §3 item 12) has no
    rates; the live view keeps the frame it showed rather than draw a sliver's figures, and
    draws the next row that has them."""
    sink = TerminalSink(file=io.StringIO(), live=True)
    drawn: list[int] = []
    render = sink.render

    def counting(result: PollResult, roles: Mapping[str, str | None] | None = None) -> object:
        drawn.append(result.step)
        return render(result, roles)

    sink.render = counting  # type: ignore[method-assign]  # counts the frames drawn
    async with served(MIXED) as (fleet, _server, c):
        sink.log_poll(await next_poll(fleet, c))
        window = c.window("train")
        await window.astart()  # a boundary poll: held
        held = c.last
        assert held is not None and held.result.held
        sink.log_poll(held.result)
        sink.log_poll(await next_poll(fleet, c))
        await window.astop()
    sink.close()
    assert drawn == [1, 3]
