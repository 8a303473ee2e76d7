"""Bad data over the real HTTP stack (docs/bad-data.md): a hostile loopback server serves the
bad body next to a healthy simulated vLLM server, and ``Collector([...]).poll()`` shows the
healthy engines' totals exact and the bad series excluded.

The hostile server is a :class:`~support.loopback.LoopbackServer` (a thread), serving whatever
body the test put in it last; the healthy one is ``fleetscope_sim`` (FleetServer), stepped in
frozen steps, so its ground truth is exact.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import AsyncIterator

import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.fleet.view import counter_increase
from fleetscope.identity import EngineId
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet
from support.bodies import sample_value, set_values
from support.loopback import LoopbackServer
from support.paths import fixture_text

LOAD = fixture_text("single_load.prom")
AFTER = fixture_text("single_after.prom")
GEN = r'^vllm:generation_tokens_total\{engine="0"'
PROMPT = r'^vllm:prompt_tokens_total\{engine="0"'
GEN_ID = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
BAD = EngineId("hostile", "0")


class Hostile:
    """A loopback server that serves the last body given to :meth:`serve` on /metrics (404
    elsewhere)."""

    def __init__(self) -> None:
        self.server = LoopbackServer({"/metrics": b""})
        self.url = self.server.url

    def serve(self, body: str) -> None:
        self.server.routes["/metrics"] = body.encode()

    def close(self) -> None:
        self.server.close()


class Rig:
    def __init__(self, fleet: SimFleet, hostile: Hostile, collector: Collector) -> None:
        self.fleet, self.hostile, self.collector = fleet, hostile, collector
        self.truth = self._truth()

    def _truth(self) -> dict[EngineId, dict[str, float]]:
        return {
            # e.engine_id, as a value
            EngineId(e.endpoint.name, e.label): {f: e.truth.counter(f) for f in COUNTERS}
            for e in self.fleet.engines()
        }

    async def poll(self, body: str, dt: float = 1.0) -> FleetView:
        """Step the healthy fleet, serve ``body`` on the hostile server, poll; check that the
        healthy engines' increases are exactly the simulator's."""
        before = self.truth
        self.fleet.step(dt)
        for ep in self.fleet.endpoints:
            ep.metrics_response()
        self.hostile.serve(body)
        view = await self.collector.poll()
        self.truth = self._truth()
        assert view.keys["inference/agg/scrape_failures"] == 0
        for eid, now in self.truth.items():
            d = view.result.deltas[eid]
            if d.baseline_only:
                continue
            for f in COUNTERS:
                assert counter_increase(d, f.removesuffix("_total")) == now[f] - before[eid][f]
        return view

    def healthy_increase(self, view: FleetView, family: str) -> float:
        total = 0.0
        for eid in self.truth:
            v = counter_increase(view.result.deltas[eid], family.removesuffix("_total"))
            total += v or 0.0
        return total


@contextlib.asynccontextmanager
async def rig() -> AsyncIterator[Rig]:
    fleet = SimFleet(seed=3, wall_start=time.time())
    fleet.add_endpoint(dp=1)
    hostile = Hostile()
    try:
        with FleetServer(fleet) as server:
            endpoints = [Endpoint(server.url(ep.name), ep.name) for ep in fleet.endpoints]
            endpoints.append(Endpoint(hostile.url, "hostile"))
            collector = Collector(
                endpoints,
                interval=3600.0,
                timeout=2.0,
                fetch_model_info=False,
                discover_roles=False,
            )
            try:
                yield Rig(fleet, hostile, collector)
            finally:
                await collector.stop(timeout=5.0)
    finally:
        hostile.close()


def _delta(view: FleetView, eid: EngineId, sid: str) -> float:
    d = view.result.deltas[eid]
    i = d.layout.index.get(sid)
    return math.nan if i is None else float(d.delta[i])


@pytest.mark.parametrize("value", ["+Inf", "NaN", "-5.0"])
async def test_http_bad_counter_value_is_excluded_and_the_rest_is_exact(value: str) -> None:
    async with rig() as r:
        await r.poll(LOAD)
        bad = set_values(AFTER, GEN, value)  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
        v = await r.poll(bad)
        # the hostile engine: its bad series left out, its other series exact
        assert GEN_ID not in v.result.deltas[BAD].layout.index
        assert _delta(v, BAD, "vllm:prompt_tokens_total") == sample_value(
            AFTER, PROMPT
        ) - sample_value(LOAD, PROMPT)
        assert v.keys["inference/agg/generation_tokens_total/delta"] == r.healthy_increase(
            v, GEN_ID
        )
        healthy_prompt = r.healthy_increase(v, "vllm:prompt_tokens_total")
        assert v.keys["inference/agg/prompt_tokens_total/delta"] == healthy_prompt + (
            sample_value(AFTER, PROMPT) - sample_value(LOAD, PROMPT)
        )
        # the next valid value counts exactly from the last valid one
        v = await r.poll(set_values(AFTER, GEN, 2100.0))
        assert _delta(v, BAD, GEN_ID) == 2100.0 - sample_value(LOAD, GEN)
        assert not v.result.deltas[BAD].restarted
        assert r.collector.summary()  # the run summary is built without raising


async def test_http_plus_inf_on_the_first_scrape_is_no_false_restart() -> None:
    async with rig() as r:
        await r.poll(set_values(LOAD, GEN, "+Inf"))  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
        v = await r.poll(AFTER)
        d = v.result.deltas[BAD]
        assert not d.restarted and d.series_new == 0
        assert math.isnan(_delta(v, BAD, GEN_ID))  # unknown baseline: never 1998 counted
        assert v.keys["inference/agg/engine_restarts_total"] == 0


def _flip(kind: str, x: float, y: float) -> str:
    head = "# TYPE vllm:x counter\n" if kind == "counter" else "# TYPE vllm:x_total gauge\n"
    return (
        head
        + f'vllm:x_total{{engine="0"}} {x}\n'
        + "# TYPE vllm:generation_tokens counter\n"
        + f'vllm:generation_tokens_total{{engine="0"}} {y}\n'
    )


async def test_http_type_flip_gets_no_delta() -> None:
    async with rig() as r:
        await r.poll(_flip("counter", 400, 10))
        await r.poll(_flip("gauge", 400, 20))
        v = await r.poll(_flip("counter", 800, 30))
        d = v.result.deltas[BAD]
        assert d.type_changed == ("vllm:x_total",)
        assert math.isnan(_delta(v, BAD, "vllm:x_total"))
        assert _delta(v, BAD, GEN_ID) == 10.0
        assert (
            v.keys["inference/agg/generation_tokens_total/delta"]
            == r.healthy_increase(v, GEN_ID) + 10.0
        )


def _stamp(body: str, ts: str) -> str:
    return "\n".join(
        f"{ln} {ts}" if ln and not ln.startswith("#") else ln for ln in body.split("\n")
    )


async def test_http_sample_timestamps_are_valid_on_every_scrape() -> None:
    async with rig() as r:
        await r.poll(_stamp(LOAD, "1700000000000"))
        v = await r.poll(_stamp(AFTER, "1700000005000"))
        assert _delta(v, BAD, GEN_ID) == sample_value(AFTER, GEN) - sample_value(LOAD, GEN)
        v = await r.poll(_stamp(set_values(AFTER, GEN, 2000.0), "1700000010000"))
        assert _delta(v, BAD, GEN_ID) == 2000.0 - sample_value(AFTER, GEN)


def _cut_after(body: str, pattern: str) -> str:
    m = re.search(pattern + r".*\n", body, re.M)
    assert m
    return body[: m.end()]


async def test_http_histogram_cut_short_is_excluded() -> None:
    async with rig() as r:
        await r.poll(LOAD)
        cut = _cut_after(AFTER, r'^vllm:time_to_first_token_seconds_bucket\{.*le="0\.1"')
        v = await r.poll(cut)
        d = v.result.deltas[BAD]
        assert not any(sid.startswith(TTFT) for sid in d.layout.slot_ids)
        assert _delta(v, BAD, GEN_ID) == sample_value(AFTER, GEN) - sample_value(LOAD, GEN)
        v = await r.poll(AFTER)
        cnt = r"^vllm:time_to_first_token_seconds_count\{"
        want = sample_value(AFTER, cnt) - sample_value(LOAD, cnt)
        assert _delta(v, BAD, TTFT + "_count") == want


async def test_http_rate_divides_by_the_interval_the_increase_spans() -> None:
    async with rig() as r:
        await r.poll(LOAD)
        await r.poll(set_values(AFTER, GEN, "NaN"), dt=1.0)  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
        v = await r.poll(AFTER, dt=1.0)
        d = v.result.deltas[BAD]
        i = d.layout.index[GEN_ID]
        assert d.span is not None and d.span[i] > d.seconds
        gen = sample_value(AFTER, GEN) - sample_value(LOAD, GEN)
        rate = v.result.stats.engine(BAD)["generation_tokens_total:rate"]
        assert rate == pytest.approx(gen / d.span[i])
        assert rate < gen / d.seconds
