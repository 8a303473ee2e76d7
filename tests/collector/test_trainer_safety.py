"""The trainer is never hurt: side requests with deadlines off the poll's critical path, sinks
behind their own bounded queues, window boundaries that return within their bound, thread-safe
reads while the fleet churns, overload in keys. Waits are on events (rows written, polls
counted), with generous upper bounds, never on a quiet machine."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import pytest

from fleetscope.collector.core import Collector
from fleetscope.collector.process import ProcessBackend
from fleetscope.identity import EngineId
from fleetscope.sinks.jsonl import JsonlSink, read_jsonl
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet
from support.loopback import LoopbackServer, Reply, Request, Route


def polls(c: Collector) -> int:
    """The step of the collector's last poll (-1 before the first): public in both modes."""
    return c.last.step if c.last is not None else -1


pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

BODY = (
    "# TYPE vllm:generation_tokens_total counter\n"
    'vllm:generation_tokens_total{engine="0",model_name="m"} 1.0\n'
)


@contextmanager
def hostile(trickle: dict[str, float]) -> Iterator[str]:
    """A server whose /metrics answers at once, and whose paths in ``trickle`` answer one byte
    every ``trickle[path]`` seconds (a JSON body that never ends in time)."""

    def trickling(seconds: float) -> Callable[[Request], Reply]:
        def reply(request: Request) -> Reply:
            body = (bytes([ch]) for ch in b'{"data": [' + b" " * 10_000)
            return Reply(body, content_type="application/json", interval=seconds)

        return reply

    routes: dict[str, Route] = {"/metrics": BODY}
    routes.update({path: trickling(seconds) for path, seconds in trickle.items()})
    with LoopbackServer(routes) as server:
        yield server.url


@contextmanager
def healthy_fleet(
    n: int = 1, step_interval: float | None = 0.2
) -> Iterator[tuple[SimFleet, FleetServer]]:
    fleet = SimFleet(seed=5)
    for _ in range(n):
        fleet.add_endpoint(dp=1)
    fleet.step(2.0)
    with FleetServer(fleet, step_interval=step_interval) as server:
        yield fleet, server


async def test_trickling_side_requests_never_slow_a_poll() -> None:
    """/v1/models and /get_metrics_worker_info answering one byte a second: every poll still
    ends within its timeout (it took ~30 s a poll, and froze the healthy servers' polls)."""
    with (
        hostile({"/v1/models": 1.0, "/get_metrics_worker_info": 1.0}) as bad,
        healthy_fleet() as (
            _,
            server,
        ),
    ):
        c = Collector([bad, *server.urls], interval=3600, timeout=1.0)
        if isinstance(c.backend, ProcessBackend):
            await c.wait_ready()  # the child's start-up is not part of a poll
        try:
            for _ in range(4):
                t0 = time.monotonic()
                view = await c.poll()
                assert time.monotonic() - t0 < 1.0 + 1.5  # the timeout, plus CPU on a busy box
                assert view.endpoints_reporting == 2
        finally:
            await c.stop(timeout=10)
    bad_engines = [e for e in view.engines.values() if e.endpoint == "server0"]
    assert bad_engines and all(e.max_model_len is None for e in bad_engines)  # unknown, not 0


class BlockingSink:
    """A sink whose ``log`` blocks until released and whose ``close`` hangs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def log(self, metrics: object, *, step: int, wall_time: float) -> None:
        self.calls += 1
        self.release.wait(120)

    def log_summary(self, summary: object) -> None:
        self.release.wait(120)

    def close(self) -> None:
        time.sleep(120)


def test_a_blocked_sink_never_stops_polling_nor_a_window(tmp_path: Path) -> None:
    """A sink blocked in ``log`` and hanging in ``close``: polling goes on, the other sink gets
    every poll, window calls return at once and stay consistent, the drops are counted in a
    key, and ``stop`` returns within its bound."""
    blocked = BlockingSink()
    path = tmp_path / "polls.jsonl"
    with healthy_fleet() as (_, server):
        c = Collector(
            server.urls,
            interval=0.1,
            sinks=[blocked, JsonlSink(path)],
            sink_queue=2,
            close_timeout=2.0,
        )
        c.start_background()
        w = c.window("train")
        t0 = time.monotonic()
        w.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and polls(c) < 15:
            time.sleep(0.05)
        keys = w.stop()
        assert time.monotonic() - t0 < 60
        assert polls(c) >= 15  # polls went on
        assert keys["inference/train/polls"] >= 1
        t1 = time.monotonic()
        c.stop_background(timeout=30)
        assert time.monotonic() - t1 < 20  # close_timeout bounds the hung close()
    rows, summary = read_jsonl(path)
    assert len(rows) >= 15  # the healthy sink got every poll
    dropped = [p["metrics"].get("inference/collector/sink_rows_dropped/BlockingSink") for p in rows]
    assert max(d for d in dropped if d is not None) > 0
    assert summary.get("run_status") == "success"
    blocked.release.set()


def test_state_dict_and_summary_are_safe_while_engines_come_and_go(isolation: str) -> None:
    """Readers in the trainer's thread while the background collector polls and the fleet
    changes (it raised ``dictionary changed size during iteration`` 1,007 times in 6,000)."""
    errors: list[BaseException] = []
    with healthy_fleet(4) as (_, server):
        urls = list(server.urls)
        c = Collector(urls[:1], interval=0.02)
        c.start_background()
        stop = threading.Event()

        def churn() -> None:
            i = 0
            while not stop.is_set():
                try:
                    c.set_endpoints(urls[: 1 + i % len(urls)])
                except Exception as e:  # pragma: no cover - a failure is the test's subject
                    errors.append(e)
                i += 1
                time.sleep(0.01)

        t = threading.Thread(target=churn)
        t.start()
        calls = 0
        # in-process a call reads the state under its lock; in a child process it is a round
        # trip, so fewer calls fit in the same time
        want = 3000 if isolation == "inline" else 20
        deadline = time.monotonic() + 120
        while (calls < want or polls(c) < 20) and time.monotonic() < deadline:
            try:
                c.state_dict()
                c.summary()
            except Exception as e:
                errors.append(e)
            calls += 1
        stop.set()
        t.join()
        c.stop_background()
    assert calls >= want and polls(c) >= 20
    assert errors == []


async def test_overload_is_counted_and_warned(caplog: pytest.LogCaptureFixture) -> None:
    """Polls slower than the interval: skipped ticks counted in a key and warned with the
    figure (they were skipped silently)."""
    fleet = SimFleet(seed=6)
    fleet.add_endpoint(dp=1)
    fleet.step(1.0)
    with FleetServer(fleet) as server:
        fleet.endpoint("server0").set_slow(0.3)
        seen: list[float] = []
        c = Collector(
            server.urls,
            interval=0.05,
            timeout=2.0,
            on_poll=lambda v: seen.append(
                v.keys.get("inference/collector/ticks_skipped_total", 0.0)
            ),
        )
        async with c:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (len(seen) < 4 or seen[-1] == 0):
                await asyncio.sleep(0.05)
    assert seen and seen[-1] > 0
    assert any("tick(s) skipped" in r.getMessage() for r in caplog.records)


class Churning:
    """A loopback server whose engine label changes every scrape."""

    def __init__(self) -> None:
        self.n = 0
        self.server = LoopbackServer({"/metrics": self.render})
        self.url = self.server.url

    def render(self, request: Request) -> str:
        self.n += 1
        return (
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="{self.n}"}} {self.n}.0\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="{self.n}"}} 1.0\n'
        )


@pytest.mark.inline_only  # reads in-process internals
async def test_churning_engine_labels_stay_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """An engine label that changes every scrape grew baselines, run sums, the view and
    ``state_dict`` by one engine per poll forever, silently. Now: at most the bound, a warning
    naming the endpoint, the evicted engines' sums folded into one row, the healthy server
    exact."""
    import json

    churn = Churning()
    with healthy_fleet(step_interval=None) as (fleet, server):  # frozen between steps
        c = Collector(
            [Endpoint(churn.url, name="churny"), *server.urls],
            interval=3600,
            max_engines_per_endpoint=4,
        )
        try:
            await c.poll()
            t0 = fleet.endpoint("server0").truth_total("vllm:generation_tokens_total")
            sizes = []
            for _ in range(40):
                fleet.step(0.5)
                view = await c.poll()
                sizes.append(len(json.dumps(c.state_dict())))
            t1 = fleet.endpoint("server0").truth_total("vllm:generation_tokens_total")
        finally:
            await c.stop()
        churn.server.close()
    # the collector's baselines are keyed by EngineId (Baselines.engines() says list[str])
    engines = cast("list[EngineId]", c.state.baselines.engines())
    churny = [e for e in engines if e.endpoint == "churny"]
    assert len(churny) <= 4
    assert len([e for e in view.engines if e.startswith("churny.")]) <= 4
    assert sizes[-1] < 2 * sizes[10]  # state_dict stops growing
    assert any("churny" in r.getMessage() and "churn" in r.getMessage() for r in caplog.records)
    s = c.summary()
    rows = {str(e) for e in c.windows.run["combined"].engines if e.startswith("churny")}
    assert "churny.evicted" in rows and len(rows) <= 5
    healthy = s["inference_summary/combined/agg/generation_tokens_total/delta"]
    assert healthy == t1 - t0  # the healthy server exact; churny never showed an increase
