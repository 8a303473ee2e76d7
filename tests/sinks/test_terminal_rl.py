"""The terminal view's RL loop cells: each engine's kind (vLLM / SGLang, detected per endpoint
from its body), the weight version it serves (with its lag) and paused / asleep."""

from __future__ import annotations

import asyncio
import io
import time

import httpx

from fleetscope.collector.core import Collector
from fleetscope.exposition import Parser
from fleetscope.fleet.state import PollResult
from fleetscope.rl.view import engine_kind
from fleetscope.sinks.terminal import TerminalSink, engine_rows
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet
from support.paths import DATA, FIXTURES

BODIES = {
    "vllm0": [FIXTURES / "vllm-0.32.0-cpu" / f"dp2_{s}.prom" for s in ("idle", "load")],
    "sglang0": [DATA / "sglang-0.5.23" / f"dp2_{s}.prom" for s in ("idle", "after")],
}


class Files:
    """A source serving saved bodies: each endpoint's n-th body at the n-th poll."""

    def __init__(self) -> None:
        self.n = 0
        self.parsers = {name: Parser() for name in BODIES}

    async def scrape(self) -> list[ScrapeResult]:
        out = []
        for name, paths in BODIES.items():
            text = paths[min(self.n, len(paths) - 1)].read_text()
            t, wall = time.monotonic(), time.time()
            out.append(
                ScrapeResult(name, self.parsers[name].parse(text, time=t, wall_time=wall), t, wall)
            )
        self.n += 1
        return out

    def take_departures(self) -> list[Departure]:
        return []

    async def aclose(self) -> None:
        return None


def render(result: PollResult, width: int = 170) -> str:
    out = io.StringIO()
    sink = TerminalSink(live=False, file=out)
    sink.console.width = width
    sink.log_poll(result)
    return out.getvalue()


async def test_the_engine_kind_is_detected_per_endpoint() -> None:
    c = Collector(source=Files(), interval=3600)
    await c.poll()
    view = await c.poll()
    await c.stop()
    info = view.result.endpoint_info
    assert info["vllm0"].kind == "vllm" and info["sglang0"].kind == "sglang"
    rows = {r.engine_id: r for r in engine_rows(view.result, {})}
    assert {r.kind for e, r in rows.items() if e.startswith("sglang0.")} == {"SGLang"}
    assert {r.kind for e, r in rows.items() if e.startswith("vllm0.")} == {"vLLM"}
    assert len(rows) == 4  # dp=2 each
    screen = render(view.result)
    assert "SGLang" in screen and "vLLM" in screen
    assert engine_kind(["ray_vllm_num_requests_running"]) == "vllm"
    assert engine_kind(["process_cpu_seconds"]) is None


async def test_weights_and_paused_asleep_per_engine() -> None:
    fleet = SimFleet(seed=13)
    for dp in (1, 2, 1):
        fleet.add_endpoint(dp=dp)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        c = Collector([Endpoint(u) for u in server.urls], interval=3600, fetch_model_info=False)
        await c.poll()
        view = await c.poll()
        rows = {r.engine_id: r for r in engine_rows(view.result, {})}
        # no RL in use: the sleep gauge still says awake; no weights column
        assert {r.state for r in rows.values()} == {"serving"}
        assert "weights" not in render(view.result)
        c.set_policy_version("v0")
        c.set_policy_version("v1")
        fleet.endpoint("server0").update_weight_version("v1")
        fleet.endpoint("server1").update_weight_version("v0")
        async with httpx.AsyncClient() as h:
            await h.post(server.url("server1") + "/pause")
        fleet.endpoint("server2").sleep(2)
        fleet.step(1.0)
        await asyncio.sleep(0.02)
        view = await c.poll()
        await c.stop()
    rows = {r.engine_id: r for r in engine_rows(view.result, {})}
    assert (rows["server0.0"].weights, rows["server0.0"].state) == ("v1", "serving")
    for e in ("server1.0", "server1.1"):
        assert (rows[e].weights, rows[e].stale, rows[e].state) == ("v0 (-1)", True, "PAUSED")
    # server2 serves "default", never announced: version shown, lag unknown
    assert (rows["server2.0"].weights, rows["server2.0"].stale) == ("default", False)
    assert rows["server2.0"].state == "ASLEEP"
    screen = render(view.result)
    assert "weights" in screen and "state" in screen
    assert "3 paused/asleep  2 on old weights" in screen
