"""``.../pooled_bounds``: how many finite bucket bounds the pooled (intersection) layout of a
scope had, next to p50/p90/p99, on a mixed vLLM + SGLang fleet (values from the bodies' text)."""

from __future__ import annotations

import asyncio
import math

from fleetscope.collector.core import Collector
from fleetscope.exposition import Parser
from fleetscope.fleet.state import FleetState, PollResult
from fleetscope.sources.base import ScrapeResult
from fleetscope_sim import FleetServer, SimFleet
from support.promql import promql_bucket_quantile

TTFT = {"vllm": "vllm:time_to_first_token_seconds", "sglang": "sglang:time_to_first_token_seconds"}


def _buckets(text: str, family: str) -> dict[float, float]:
    """Cumulative buckets of ``family`` summed over every child of the body, from the text."""
    out: dict[float, float] = {}
    for ln in text.split("\n"):
        if ln.startswith(family + "_bucket{"):
            le = ln.split('le="', 1)[1].split('"', 1)[0]
            b = math.inf if le == "+Inf" else float(le)
            out[b] = out.get(b, 0.0) + float(ln.rsplit(" ", 1)[1])
    return out


def test_mixed_fleet_pooled_bounds_and_quantiles_from_the_text() -> None:
    fleet = SimFleet.build(4, dp=2, engine_kind="mixed", seed=11, wall_start=1.79e9)
    fleet.run(6.0, dt=0.5)
    state = FleetState()
    parsers: dict[str, Parser] = {}
    texts: list[dict[str, str]] = []
    res: PollResult | None = None
    for step in (0.0, 15.0):
        fleet.run(step, dt=0.5)
        t = fleet.clock.sim_time
        bodies = {ep.name: ep.render().decode() for ep in fleet.endpoints}
        texts.append(bodies)
        scrapes: list[ScrapeResult] = []
        for ep in fleet.endpoints:
            expo = parsers.setdefault(ep.name, Parser()).parse(bodies[ep.name], time=t)
            groups = (ep.engine_kind,)  # a user scope per engine kind
            scrapes.append(ScrapeResult(ep.name, expo, t, 1.79e9 + t, groups=groups))
        res = state.observe(scrapes)
    assert res is not None
    deltas: dict[str, dict[float, float]] = {}
    for ep in fleet.endpoints:
        fam = TTFT[ep.engine_kind]
        a, b = _buckets(texts[0][ep.name], fam), _buckets(texts[1][ep.name], fam)
        deltas[ep.name] = {k: b[k] - a.get(k, 0.0) for k in b}
    shared = set.intersection(*(set(d) for d in deltas.values()))
    assert sorted(x for x in shared if math.isfinite(x)) == [0.1, 1.0, 10.0, 20.0, 40.0, 80.0]
    pooled = [(le, sum(d[le] for d in deltas.values())) for le in sorted(shared)]
    assert pooled[-1][1] > 0
    m = res.stats.scopes["agg"].metrics["time_to_first_token_seconds"]
    assert m["pooled_bounds"] == 6.0
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert m[label] == promql_bucket_quantile(q, pooled)
    # one engine kind per scope: its own, finer layout
    vllm = res.stats.scopes["vllm"].metrics["time_to_first_token_seconds"]
    sglang = res.stats.scopes["sglang"].metrics["time_to_first_token_seconds"]
    assert vllm["pooled_bounds"] == len(deltas["server0"]) - 1 == 22.0
    assert sglang["pooled_bounds"] == len(deltas["server1"]) - 1 == 18.0


def test_no_observations_no_pooled_bounds() -> None:
    fleet = SimFleet.build(1, dp=1, seed=1)
    fleet.endpoints[0].set_arrival_rate(0.0)
    state, parser = FleetState(), Parser()
    res = None
    for t in (0.0, 5.0):
        if t:
            fleet.run(t)
        expo = parser.parse(fleet.endpoints[0].render(), time=t)
        res = state.observe([ScrapeResult("server0", expo, t, 1.79e9 + t)])
    assert res is not None
    m = res.stats.scopes["agg"].metrics.get("time_to_first_token_seconds", {})
    assert "p50" not in m and "pooled_bounds" not in m


def test_pooled_bounds_in_poll_window_and_summary_keys_and_versions_in_summary() -> None:
    async def main() -> tuple[dict[str, float], dict[str, float], dict[str, float | str]]:
        fleet = SimFleet.build(2, dp=2, engine_kind="mixed", seed=3)
        fleet.step(3.0)
        with FleetServer(fleet, step_interval=0.2) as server:
            async with Collector(server.urls, interval=60.0) as c:
                w = c.window("train")
                await w.astart()
                poll: dict[str, float] = {}
                for _ in range(50):  # until both kinds saw first tokens in one interval
                    t = fleet.clock.sim_time
                    for _ in range(1200):  # the fleet steps by real elapsed time
                        if fleet.clock.sim_time >= t + 1.0:
                            break
                        await asyncio.sleep(0.05)
                    poll = dict((await c.poll()).keys)
                    if poll.get("inference/agg/time_to_first_token_seconds/pooled_bounds") == 6:
                        break
                keys = await w.astop()
                return poll, keys, c.summary()

    poll, window, summary = asyncio.run(main())
    assert poll["inference/agg/time_to_first_token_seconds/pooled_bounds"] == 6.0
    assert window["inference/train/agg/time_to_first_token_seconds/pooled_bounds"] == 6.0
    combined = "inference_summary/combined/agg/time_to_first_token_seconds/"
    assert summary[combined + "pooled_bounds"] == 6.0 and combined + "p90" in summary
    assert summary["inference_summary/endpoints/server0/engine_version"] == "0.32.0"
    assert summary["inference_summary/endpoints/server0/engine_kind"] == "vllm"
    assert summary["inference_summary/endpoints/server1/engine_version"] == "0.5.23"
    assert summary["inference_summary/endpoints/server1/engine_kind"] == "sglang"
