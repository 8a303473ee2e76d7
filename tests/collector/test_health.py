"""Health conditions (fleetscope.health) in a simulated fleet, over real HTTP.

Each fault is injected into one engine (or one endpoint) of a simulated fleet that a
:class:`Collector` polls over loopback HTTP, in frozen steps (step the fleet, then poll). For
every condition the test checks that it names the right engine id and only that one, that no
other engine is reported with anything, that the per-poll count keys
``inference/health/{condition}`` agree with the events, and that the terminal view puts the sick
engine first. A healthy fleet, polled for several simulated minutes with the default
thresholds, reports nothing.
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.health import CONDITIONS, HealthEvent, HealthMonitor, HealthThresholds
from fleetscope.sinks.terminal import STATUS, TerminalSink
from fleetscope.sources.base import ScrapeResult
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, LoadProfile, SimFleet
from support.loads import KV_PRESSURE_LOAD

pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

KV_PRESSURE = LoadProfile(**KV_PRESSURE_LOAD)
PLAIN = [{"dp": 2}, {"dp": 1}]  # server0.0, server0.1, server1.0
DISAGG = [  # prefill0.0, prefill0.1, decode0.0, decode0.1, decode1.0
    {"role": "prefill", "dp": 2},
    {"role": "decode", "dp": 2},
    {"role": "decode", "dp": 1},
]


@dataclass
class Run:
    """What a collector reported, poll by poll."""

    views: list[FleetView] = field(default_factory=list)
    rendered: str = ""  # the terminal's output for the last poll

    @property
    def events(self) -> list[HealthEvent]:
        return [e for v in self.views for e in v.result.events]

    def subjects(self, condition: str | None = None) -> set[str]:
        return {e.subject for e in self.events if condition in (None, e.condition)}


@asynccontextmanager
async def polled(
    specs: list[dict[str, Any]],
    *,
    seed: int = 11,
    thresholds: HealthThresholds | None = None,
    load: LoadProfile | None = None,
) -> AsyncIterator[tuple[SimFleet, Collector, TerminalSink, io.StringIO]]:
    """A fleet (endpoints per ``specs``, already busy) served on loopback, and a collector with
    a non-live terminal sink polling it only when asked."""
    fleet = SimFleet(seed=seed)
    for spec in specs:
        fleet.add_endpoint(**{"load": load, **spec})
    fleet.step(3.0)
    screen = io.StringIO()
    terminal = TerminalSink(live=False, file=screen)
    with FleetServer(fleet) as server:
        endpoints = [Endpoint(server.url(ep.name), ep.name, ep.role) for ep in fleet.endpoints]
        collector = Collector(
            endpoints,
            interval=3600.0,
            timeout=5.0,
            fetch_model_info=False,
            verify=False,
            health_thresholds=thresholds,
            sinks=[terminal],
        )
        try:
            yield fleet, collector, terminal, screen
        finally:
            await collector.stop(timeout=10.0)


async def step_and_poll(fleet: SimFleet, c: Collector, dt: float, pause: float) -> FleetView:
    """One frozen step, then one poll. The responses are built before the poll (the simulator
    shares this process), and ``pause`` adds real time: rates are per real second between an
    engine's scrapes, so a pause makes scrape-time jitter small next to the interval."""
    fleet.step(dt)
    for ep in fleet.endpoints:
        ep.metrics_response()
    if pause:
        await asyncio.sleep(pause)
    view = await c.poll()
    await c.flush_sinks()  # sinks draw in their own threads: wait for the terminal's frame
    return view


def first_row_id(text: str, ids: set[str]) -> str:
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells and cells[0] in ids:
            return cells[0]
    raise AssertionError(f"no engine row in:\n{text}")


def assert_keys_match_events(run: Run, prefix: str = "inference") -> None:
    """Every poll logs every condition's count, equal to that poll's events."""
    for v in run.views:
        for cond in CONDITIONS:
            want = sum(1 for e in v.result.events if e.condition == cond)
            assert v.keys[f"{prefix}/health/{cond}"] == want, (v.step, cond)


# --------------------------------------------------------------------------- one sick engine


@dataclass(frozen=True)
class Scenario:
    specs: list[dict[str, Any]]
    inject: Callable[[SimFleet], None]
    target: str  # the engine id (or endpoint name) that must be reported, and nothing else
    polls: int = 8
    dt: float = 1.0
    pause: float = 0.05
    thresholds: HealthThresholds | None = None


SCENARIOS: dict[str, Scenario] = {
    # a decode engine stops generating while its requests stay running; the prefill engines
    # (one token per request by design) and the healthy decode engines are not reported.
    # `stall_seconds` is real time between scrapes: 0.5 s is reached after a few paused polls
    "generation_stalled": Scenario(
        DISAGG,
        lambda f: f.endpoint("decode0").stall(engine=1),
        "decode0.1",
        pause=0.2,
        thresholds=HealthThresholds(stall_seconds=0.5),
    ),
    # streak seconds are real seconds between scrapes, milliseconds here: polls decide
    "kv_cache_near_full": Scenario(
        [{"dp": 2}, {"dp": 1, "load": KV_PRESSURE}],
        lambda f: None,
        "server1.0",
        dt=5.0,
        thresholds=HealthThresholds(kv_seconds=0.0),
    ),
    # ~60 requests/s on one engine of a dp=2 server: several times what it can serve
    "queue_growing": Scenario(
        PLAIN,
        lambda f: f.endpoint("server0").set_arrival_rate(60.0, engine=1),
        "server0.1",
        thresholds=HealthThresholds(queue_seconds=0.0),
    ),
    "preemption_burst": Scenario(
        [{"dp": 2}, {"dp": 1, "load": KV_PRESSURE}], lambda f: None, "server1.0", dt=5.0
    ),
    # one of three decode engines 40x slower: its token rate falls far below the role's median
    # (`outlier_seconds` is real time too: 0.5 s is reached after a few paused polls)
    "engine_outlier": Scenario(
        DISAGG,
        lambda f: f.endpoint("decode0").set_slowdown(40.0, engine=0),
        "decode0.0",
        pause=0.2,
        thresholds=HealthThresholds(outlier_seconds=0.5),
    ),
    "scrape_failed": Scenario(
        PLAIN, lambda f: f.endpoint("server1").set_http_error(500), "server1", polls=3
    ),
}


@pytest.mark.parametrize("condition", list(SCENARIOS))
async def test_condition_names_the_sick_engine_and_only_it(
    condition: str, caplog: pytest.LogCaptureFixture
) -> None:
    sc = SCENARIOS[condition]
    run = Run()
    caplog.set_level(logging.WARNING, logger="fleetscope")
    async with polled(sc.specs, thresholds=sc.thresholds) as (fleet, c, terminal, screen):
        run.views.append(await c.poll())  # baselines, before the fault
        await c.flush_sinks()
        sc.inject(fleet)
        for _ in range(sc.polls):
            screen.seek(0)
            screen.truncate()
            run.views.append(await step_and_poll(fleet, c, sc.dt, sc.pause))
        rows = list(terminal.last_rows)
        run.rendered = screen.getvalue()
        last = run.views[-1]

    # reported, naming the right engine (or endpoint) ...
    assert run.subjects(condition) == {sc.target}, run.events
    # ... and nothing at all about any other engine or endpoint (a sick engine may be in
    # several conditions: a stalled engine's queue grows too, a full KV cache preempts)
    assert run.subjects() == {sc.target}, run.events
    # the condition still holds at the last poll, so the key and the terminal show it now
    assert sc.target in {e.subject for e in last.result.events if e.condition == condition}
    assert last.keys[f"inference/health/{condition}"] == 1
    assert_keys_match_events(run)

    # the operator hears about it, by name (scrape failures are warned by the source)
    warned = [r.getMessage() for r in caplog.records if sc.target in r.getMessage()]
    assert warned, [r.getMessage() for r in caplog.records]

    # the terminal puts the sick engine first, flagged; every other engine is OK
    shown = sc.target if condition != "scrape_failed" else f"{sc.target}.*"
    assert rows[0].engine_id == shown
    assert rows[0].status != "OK" and rows[0].severity > 0
    if condition != "scrape_failed":
        worst = max((STATUS[e.condition] for e in last.result.events), key=lambda s: s[1])
        assert rows[0].status == worst[0]
    else:
        assert rows[0].status == "NO DATA"
    assert all(r.status == "OK" for r in rows[1:]), rows
    ids = {r.engine_id for r in rows}
    assert first_row_id(run.rendered, ids) == shown
    assert rows[0].status in run.rendered


async def test_stall_needs_stall_seconds_of_real_time() -> None:
    """With ``stall_seconds=3``: a stalled engine is reported exactly once the real time between
    its last scrape with a new token and its current scrape reaches 3 s (a scrape interval
    without a token is not yet a stall), and no longer once it generates again."""

    def scrape_time(view: FleetView) -> float:
        return next(sc.time for sc in view.result.scrapes if sc.endpoint == "decode1")

    async with polled(DISAGG, thresholds=HealthThresholds(stall_seconds=3.0)) as (fleet, c, _, _):
        base = scrape_time(await c.poll())
        fleet.endpoint("decode1").stall()
        seen: list[tuple[float, bool]] = []
        while not seen or not seen[-1][1]:
            assert len(seen) < 20, seen
            view = await step_and_poll(fleet, c, 1.0, 0.4)
            stalled = [e.subject for e in view.result.events if e.condition == "generation_stalled"]
            assert stalled in ([], ["decode1.0"])
            seen.append((scrape_time(view) - base, bool(stalled)))
        assert all((elapsed >= 3.0) == fired for elapsed, fired in seen), seen
        assert len(seen) > 1  # polls that saw no token for less than 3 s reported nothing
        # tokens again: the condition clears at once
        fleet.endpoint("decode1").unstall()
        view = await step_and_poll(fleet, c, 1.0, 0.0)
        assert not [e for e in view.result.events if e.condition == "generation_stalled"]
        assert view.keys["inference/health/generation_stalled"] == 0


# --------------------------------------------------------------------------- healthy fleets


@pytest.mark.parametrize(
    ("roles", "load", "seed", "polls"),
    [
        # default load (4 requests/s per engine), mixed plain and disaggregated endpoints
        ([None, None, "prefill", "decode", "decode", "decode"], None, 0, 60),
        # a busy but healthy fleet: 12 requests/s per engine keeps KV at 60-99 %, with
        # occasional preemptions and short queues
        ([None, "prefill", "decode", "decode"], LoadProfile(arrival_rate=12.0), 2, 40),
    ],
    ids=["default-load", "busy"],
)
async def test_healthy_fleet_reports_nothing(
    roles: list[str | None], load: LoadProfile | None, seed: int, polls: int
) -> None:
    """Several simulated minutes (5 s between polls, as the default interval) of a healthy
    fleet: no condition fires, every count key is logged as 0, the terminal says all healthy.

    Poll-count thresholds are the defaults. The durations (``stall_seconds``,
    ``outlier_seconds``, ``kv_seconds``, ``queue_seconds``) are real seconds between scrapes,
    which here are milliseconds per simulated 5 s, so they are set to 0: the poll counts alone
    decide, and for stalls and outliers one bad poll would fire."""
    specs = [{"role": r, "dp": 2} for r in roles]
    run = Run()
    statuses: list[set[str]] = []
    strict = HealthThresholds(
        stall_seconds=0.0, outlier_seconds=0.0, kv_seconds=0.0, queue_seconds=0.0
    )
    async with polled(specs, seed=seed, load=load, thresholds=strict) as (
        fleet,
        c,
        terminal,
        screen,
    ):

        async def shown() -> None:  # what the terminal shows once it has drawn the poll
            await c.flush_sinks()
            statuses.append({r.status for r in terminal.last_rows})

        run.views.append(await c.poll())
        await shown()
        for _ in range(polls):
            run.views.append(await step_and_poll(fleet, c, 5.0, 0.0))
            await shown()
        # stop() polls once more without a fleet step: no token in it, and at 0 s that is a stall
        kv_max = max(
            (e.kv_usage for v in run.views for e in v.engines.values() if e.kv_usage), default=0
        )
    assert run.events == []
    assert_keys_match_events(run)
    assert statuses and all(s == {"OK"} for s in statuses)
    assert "all healthy" in screen.getvalue()
    # the fleet was doing real work all along
    gen = [v.keys["inference/agg/generation_tokens_total:rate/sum"] for v in run.views[1:]]
    assert min(gen) > 0
    if load is not None:
        assert kv_max > 0.9  # busy: the KV cache did reach high usage, and that is fine


# --------------------------------------------------------------------------- streak rules


class _Stats:
    """The parts of PollStats that HealthMonitor reads, for the streak rules."""

    def __init__(self, rows: dict[str, dict[str, float]], seconds: float = 5.0) -> None:
        self.engine_ids = list(rows)
        self.is_engine = [True] * len(rows)
        self.seconds = np.full(len(rows), seconds)
        self._rows = rows

    def engine(self, eid: str) -> dict[str, float]:
        return self._rows[eid]

    def engine_values(self, columns: Sequence[str]) -> dict[str, dict[str, float]]:
        return {e: {c: v for c, v in m.items() if c in columns} for e, m in self._rows.items()}


class _Result:
    def __init__(self, rows: dict[str, dict[str, float]]) -> None:
        self.stats = _Stats(rows)
        self.scrapes: list[ScrapeResult] = []


def _decode_rows(gen: dict[str, float], kv: float = 0.5) -> dict[str, dict[str, float]]:
    return {
        eid: {
            "num_requests_running": 8.0,
            "num_requests_waiting": 0.0,
            "generation_tokens_total:rate": g,
            "kv_cache_usage_perc": kv if eid == "d0" else 0.5,
        }
        for eid, g in gen.items()
    }


def test_kv_near_full_needs_consecutive_polls() -> None:
    """A single reading at >= 95 % is routine for a busy engine; two in a row (5 s apart:
    the default 10 s) are reported."""
    mon = HealthMonitor()
    roles = dict.fromkeys(("d0", "d1", "d2"), "decode")
    gen = {"d0": 100.0, "d1": 100.0, "d2": 100.0}

    def kv_events(kv: float) -> list[str]:
        events = mon.evaluate(_Result(_decode_rows(gen, kv)), roles)  # type: ignore[arg-type]
        return [e.subject for e in events if e.condition == "kv_cache_near_full"]

    assert kv_events(0.99) == []
    assert kv_events(0.90) == []  # the streak is broken
    assert kv_events(0.97) == []
    assert kv_events(1.0) == ["d0"]
    assert kv_events(0.96) == ["d0"]


def test_outlier_streak_is_broken_by_a_poll_that_is_not_judged() -> None:
    """``outlier_seconds`` *in a row* (5 s per poll here, so 10 s is two polls): a poll in which
    the role is not judged (idle, its median below ``outlier_min_median``) ends the streak
    instead of pausing it."""
    mon = HealthMonitor(HealthThresholds(outlier_seconds=10.0))
    roles = dict.fromkeys(("d0", "d1", "d2"), "decode")

    def outliers(gen: dict[str, float]) -> list[str]:
        events = mon.evaluate(_Result(_decode_rows(gen)), roles)  # type: ignore[arg-type]
        return [e.subject for e in events if e.condition == "engine_outlier"]

    slow = {"d0": 1.0, "d1": 100.0, "d2": 100.0}
    assert outliers(slow) == []  # 1 of 2
    assert outliers({"d0": 0.0, "d1": 0.5, "d2": 0.5}) == []  # median < 1 tok/s: not judged
    assert outliers(slow) == []  # 1 of 2 again, not 2 of 2
    assert outliers(slow) == ["d0"]


def test_streaks_need_their_seconds_too() -> None:
    """At a fast poll interval, polls in a row are not enough: the streak must also last
    ``kv_seconds`` / ``queue_seconds`` of real time (the defaults agree with the poll counts
    at 5 s)."""
    roles = dict.fromkeys(("d0", "d1", "d2"), "decode")
    gen = {"d0": 100.0, "d1": 100.0, "d2": 100.0}

    def evaluate(mon: HealthMonitor, kv: float, waiting: float, seconds: float) -> set[str]:
        result = _Result(_decode_rows(gen, kv))
        result.stats.seconds[:] = seconds
        result.stats._rows["d0"]["num_requests_waiting"] = waiting
        return {e.condition for e in mon.evaluate(result, roles) if e.subject == "d0"}  # type: ignore[arg-type]

    fast = HealthMonitor()  # 1 s polls: 10 and 20 polls needed, not 2 and 4
    seen = [evaluate(fast, 0.99, 10.0 + i, 1.0) for i in range(25)]
    kv_first = next(i for i, c in enumerate(seen) if "kv_cache_near_full" in c)
    queue_first = next(i for i, c in enumerate(seen) if "queue_growing" in c)
    assert kv_first == 9  # 10 polls, 10 s
    assert queue_first == 20  # the first poll is the queue's baseline: 20 growths, 20 s
    default = HealthMonitor()  # 5 s polls: the poll counts decide, as before
    seen = [evaluate(default, 0.99, 10.0 + i, 5.0) for i in range(6)]
    assert next(i for i, c in enumerate(seen) if "kv_cache_near_full" in c) == 1
    assert next(i for i, c in enumerate(seen) if "queue_growing" in c) == 4


def _sglang_replay(
    path: str, decode_growth: float, times: Sequence[float] = (0.0, 20.0, 40.0)
) -> list[list[HealthEvent]]:
    """A real SGLang 0.5.23 body replayed at ``times``: its tokenizer counters unchanged (long
    requests, none finished: SGLang counts generation tokens when a request finishes), its
    scheduler's decode counter grown by ``decode_growth`` per replay."""
    from fleetscope.exposition import Parser
    from fleetscope.fleet.state import FleetState
    from fleetscope.sources.base import ScrapeResult
    from support.paths import DATA

    body = (DATA / "sglang-0.5.23" / path).read_text()
    decode = re.compile(r'^(sglang:realtime_tokens_total\{.*mode="decode".*\}) (\S+)$', re.M)
    state, parser, monitor = FleetState(), Parser(), HealthMonitor()
    out = []
    for n, t in enumerate(times):

        def grown(m: re.Match[str], n: int = n) -> str:
            return f"{m[1]} {float(m[2]) + n * decode_growth!r}"

        text = decode.sub(grown, body)
        expo = parser.parse(text, time=t, wall_time=1e9 + t)
        result = state.observe([ScrapeResult("sg", expo, t, 1e9 + t)])
        out.append(monitor.evaluate(result, {}))
    return out


@pytest.mark.inline_only  # no collector: the monitor on parsed real bodies
@pytest.mark.parametrize("path", ["single_after.prom", "dp2_after.prom"])
def test_an_sglang_engine_decoding_long_requests_is_not_stalled(path: str) -> None:
    """SGLang's generation counter moves only when a request finishes; its scheduler's decode
    counter moves per engine as tokens are made. Health judges stalls on the latter (DP > 1
    too, where the generation counter is the server's, not an engine's)."""
    polls = _sglang_replay(path, decode_growth=500.0)
    assert not [e for events in polls for e in events if e.condition == "generation_stalled"]
    # nothing decoded at all for 40 s with requests running: stalled, per engine
    polls = _sglang_replay(path, decode_growth=0.0)
    stalled = {e.subject for e in polls[-1] if e.condition == "generation_stalled"}
    assert stalled == ({"sg.0"} if path.startswith("single") else {"sg.0", "sg.1"})
