"""Role discovery (``Collector._discover_roles``) against simulated servers over real HTTP.

Endpoints given without a role ask ``GET /get_metrics_worker_info`` once (SkyRL's protocol:
``{"worker_id": ..., "role": null | "prefill" | "decode"}``); a server without that route that
exposes vLLM's KV-consumer gauge (``vllm:num_requests_kv_fetch_by_stage``) is a decode server;
anything else keeps no role, silently. Explicit roles are never overridden.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from fleetscope.catalog import KV_CONSUMER_FAMILY
from fleetscope.collector.core import Collector, FleetView
from fleetscope.health import HealthThresholds
from fleetscope.sinks.terminal import TerminalSink
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import CONTENT_TYPE_LATEST, FleetServer, SimEndpoint, SimFleet

WORKER_INFO = "/get_metrics_worker_info"
GEN = "generation_tokens_total:rate"


def kv_consumer_lines(endpoint: SimEndpoint) -> bytes:
    """vLLM's KV-consumer gauge, as a disaggregated decode server exposes it."""
    lines = [f"# HELP {KV_CONSUMER_FAMILY} Requests fetching KV from a remote prefill server"]
    lines.append(f"# TYPE {KV_CONSUMER_FAMILY} gauge")
    for e in endpoint.engines:
        for stage in ("waiting", "transferring"):
            labels = f'engine="{e.index}",model_name="{endpoint.model_name}",stage="{stage}"'
            lines.append(f"{KV_CONSUMER_FAMILY}{{{labels}}} 0.0")
    return ("\n".join(lines) + "\n").encode()


class RouteServer(FleetServer):
    """A FleetServer that counts requests per (endpoint, path), can answer 404 to
    ``/get_metrics_worker_info`` (a server that predates the route) and can add the
    KV-consumer gauge to ``/metrics``."""

    def __init__(
        self,
        fleet: SimFleet,
        *,
        no_worker_info: Iterable[str] = (),
        kv_consumers: Iterable[str] = (),
    ) -> None:
        super().__init__(fleet)
        self.no_worker_info = set(no_worker_info)
        self.kv_consumers = set(kv_consumers)
        self.requests: Counter[tuple[str, str]] = Counter()

    async def _respond(
        self,
        endpoint: SimEndpoint,
        method: str,
        path: str,
        writer: asyncio.StreamWriter,
        keep_alive: bool,
        body: bytes = b"",
        query: str = "",
    ) -> bool:
        self.requests[(endpoint.name, path)] += 1
        if path == WORKER_INFO and endpoint.name in self.no_worker_info:
            body = b'{"detail":"Not Found"}'
            return await self._send(writer, 404, "application/json", body, keep_alive, method)
        if path == "/metrics" and endpoint.name in self.kv_consumers:
            body = endpoint.render() + kv_consumer_lines(endpoint)
            return await self._send(writer, 200, CONTENT_TYPE_LATEST, body, keep_alive, method)
        return await super()._respond(endpoint, method, path, writer, keep_alive, body, query)

    def asked(self, name: str) -> int:
        return self.requests[(name, WORKER_INFO)]


@asynccontextmanager
async def served(
    specs: list[dict[str, Any]], *, seed: int = 5, **server_kw: Any
) -> AsyncIterator[tuple[SimFleet, RouteServer]]:
    fleet = SimFleet(seed=seed)
    for spec in specs:
        fleet.add_endpoint(**spec)
    fleet.step(3.0)
    server = RouteServer(fleet, **server_kw)
    server.start()  # (it returns the server, but typed as a FleetServer)
    try:
        yield fleet, server
    finally:
        server.stop()


def collector(endpoints: Sequence[str | Endpoint], **kw: Any) -> Collector:
    kw.setdefault("interval", 3600.0)
    kw.setdefault("timeout", 5.0)
    kw.setdefault("fetch_model_info", False)
    kw.setdefault("verify", False)
    return Collector(endpoints, **kw)


async def step_and_poll(fleet: SimFleet, c: Collector, n: int = 1) -> FleetView:
    view = None
    for _ in range(n):
        fleet.step(1.0)
        await asyncio.sleep(0.02)
        view = await c.poll()
    assert view is not None
    return view


def truth(fleet: SimFleet, sim_names: Iterable[str], family: str) -> float:
    return sum(fleet.endpoint(n).truth_total(family) for n in sim_names)


def fleetscope_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("fleetscope") and r.levelno >= logging.WARNING
    ]


@pytest.fixture(autouse=True)
def _capture(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fleetscope")


# --------------------------------------------------------------------------- discovery


async def test_roles_from_worker_info_after_the_first_poll(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Four servers given as bare URLs (display names server0..server3): after the first poll
    the prefill and decode ones are in their scopes, exactly, and each was asked once."""
    specs: list[dict[str, Any]] = [
        {"role": "prefill", "dp": 2},  # server0
        {"role": "decode", "dp": 1},  # server1
        {"role": "decode", "dp": 2},  # server2
        {"role": None, "dp": 1},  # server3: answers role null
    ]
    async with served(specs) as (fleet, server):
        c = collector(server.urls)  # no roles given
        first = await c.poll()
        p0 = truth(fleet, ["prefill0"], "vllm:prompt_tokens_total")
        d0 = truth(fleet, ["decode0", "decode1"], "vllm:generation_tokens_total")
        view = await step_and_poll(fleet, c, n=3)
        p1 = truth(fleet, ["prefill0"], "vllm:prompt_tokens_total")
        d1 = truth(fleet, ["decode0", "decode1"], "vllm:generation_tokens_total")
        await c.stop()
    assert [e.name for e in c.endpoints] == ["server0", "server1", "server2", "server3"]
    assert [e.role for e in c.endpoints] == ["prefill", "decode", "decode", None]

    # already the first poll reports per role
    k = first.keys
    assert k["inference/prefill/engines_reporting"] == 2
    assert k["inference/decode/engines_reporting"] == 3
    assert k["inference/agg/engines_reporting"] == 6
    assert "inference/prefill/num_requests_running/sum" in k
    assert "inference/decode/kv_cache_usage_perc/max" in k
    roles = {eid: e.role for eid, e in first.engines.items()}
    assert roles == {
        "server0.0": "prefill",
        "server0.1": "prefill",
        "server1.0": "decode",
        "server2.0": "decode",
        "server2.1": "decode",
        "server3.0": None,
    }
    assert {sc.endpoint: sc.role for sc in first.result.scrapes}["server2"] == "decode"

    # role scopes are exact (per-engine deltas of the right engines only)
    combined = c.summary()
    s = "inference_summary/combined"
    assert combined[f"{s}/prefill/prompt_tokens_total/delta"] == p1 - p0
    assert combined[f"{s}/decode/generation_tokens_total/delta"] == d1 - d0
    agg_gen = combined[f"{s}/agg/generation_tokens_total/delta"]
    assert not isinstance(agg_gen, str) and agg_gen > d1 - d0  # + prefill + server3

    # asked once per endpoint, never again; no warning
    for name in ("prefill0", "decode0", "decode1", "server0"):
        assert server.asked(name) == 1, name
    assert fleetscope_warnings(caplog) == []
    found = [r.getMessage() for r in caplog.records if "discovered as a" in r.getMessage()]
    assert sorted(found) == [
        "fleetscope: server0 discovered as a prefill server",
        "fleetscope: server1 discovered as a decode server",
        "fleetscope: server2 discovered as a decode server",
    ]
    # the terminal shows the discovered roles
    terminal = TerminalSink(live=False, file=io.StringIO())
    terminal.render(view.result)
    assert {r.engine_id: r.role for r in terminal.last_rows}["server2.1"] == "decode"


async def test_without_the_route_no_role_and_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A server that answers 404 to ``/get_metrics_worker_info`` keeps no role: asked once,
    nothing logged, its engines count in ``agg`` only."""
    specs: list[dict[str, Any]] = [{"role": "decode", "dp": 2}, {"role": "decode", "dp": 1}]
    async with served(specs, no_worker_info={"decode1"}) as (fleet, server):
        c = collector(server.urls)
        await c.poll()
        view = await step_and_poll(fleet, c, n=4)
        await c.stop()
    assert [e.role for e in c.endpoints] == ["decode", None]
    assert server.asked("decode0") == 1 and server.asked("decode1") == 1
    assert server.requests[("decode1", "/metrics")] >= 6  # polled all along
    assert fleetscope_warnings(caplog) == []
    k = view.keys
    assert k["inference/decode/engines_reporting"] == 2
    assert k["inference/agg/engines_reporting"] == 3
    assert view.engines["server1.0"].role is None


async def test_kv_consumer_gauge_marks_a_decode_server(caplog: pytest.LogCaptureFixture) -> None:
    """No worker-info route, but the KV-consumer gauge: a decode server. Without the gauge
    (server1) nothing is guessed."""
    specs: list[dict[str, Any]] = [{"role": "decode", "dp": 2}, {"role": "decode", "dp": 1}]
    async with served(specs, no_worker_info={"decode0", "decode1"}, kv_consumers={"decode0"}) as (
        fleet,
        server,
    ):
        c = collector(server.urls)
        first = await c.poll()
        await step_and_poll(fleet, c, n=2)
        await c.stop()
    assert [e.role for e in c.endpoints] == ["decode", None]
    assert first.keys["inference/decode/engines_reporting"] == 2
    assert server.asked("decode0") == 1 and server.asked("decode1") == 1
    assert fleetscope_warnings(caplog) == []


async def test_explicit_roles_are_never_overridden(caplog: pytest.LogCaptureFixture) -> None:
    """Roles given by the caller win over what the server says (worker info, KV gauge); the
    server is not even asked."""
    specs: list[dict[str, Any]] = [
        {"role": "prefill", "dp": 1},
        {"role": "decode", "dp": 1},
        {"role": None},
    ]
    async with served(specs, kv_consumers={"decode0"}) as (fleet, server):
        urls = server.urls
        c = collector(
            [
                Endpoint(urls[0], role="decode"),  # says prefill
                Endpoint(urls[1], role="prefill"),  # says decode, and has the KV gauge
                urls[2],  # says null: asked, stays without a role
            ]
        )
        first = await c.poll()
        view = await step_and_poll(fleet, c, n=2)
        await c.stop()
    assert [(e.name, e.role) for e in c.endpoints] == [
        ("decode0", "decode"),
        ("prefill0", "prefill"),
        ("server0", None),
    ]
    assert server.asked("prefill0") == 0 and server.asked("decode0") == 0
    assert server.asked("server0") == 1
    for v in (first, view):
        assert v.engines["decode0.0"].role == "decode"
        assert v.engines["prefill0.0"].role == "prefill"
        assert v.keys["inference/prefill/engines_reporting"] == 1
        assert v.keys["inference/decode/engines_reporting"] == 1
    assert fleetscope_warnings(caplog) == []


async def test_role_asked_at_the_first_successful_scrape(caplog: pytest.LogCaptureFixture) -> None:
    """An endpoint that is down at first is asked for its role once it answers, not before."""
    specs: list[dict[str, Any]] = [{"role": "decode", "dp": 1}, {"role": "prefill", "dp": 1}]
    async with served(specs) as (fleet, server):
        fleet.endpoint("prefill0").set_http_error(503)
        c = collector(server.urls)
        view = await c.poll()
        assert view.endpoints_reporting == 1
        assert server.asked("prefill0") == 0
        assert [e.role for e in c.endpoints] == ["decode", None]
        fleet.endpoint("prefill0").clear_faults()
        view = await step_and_poll(fleet, c)
        await step_and_poll(fleet, c)
        await c.stop()
    assert [e.role for e in c.endpoints] == ["decode", "prefill"]
    assert server.asked("prefill0") == 1
    assert view.keys["inference/prefill/engines_reporting"] == 1


# --------------------------------------------------------------------------- tails


async def test_discovered_roles_make_tails_role_aware() -> None:
    """Discovered roles feed the role-aware reductions: a prefill engine's few generated
    tokens (one per request, by design) never pin the decode or fleet generation-rate tail,
    while a stalled decode engine does, and is the one health reports."""
    specs: list[dict[str, Any]] = [
        {"role": "prefill", "dp": 2},  # server0.0, server0.1
        {"role": "decode", "dp": 2},  # server1.0, server1.1
        {"role": "decode", "dp": 1},  # server2.0
    ]
    async with served(specs) as (fleet, server):
        c = collector(server.urls, health_thresholds=HealthThresholds(stall_seconds=0.0))
        await c.poll()
        healthy = await step_and_poll(fleet, c, n=2)
        fleet.endpoint("decode0").stall(engine=1)
        sick = await step_and_poll(fleet, c, n=2)
        await c.stop()

    def rates(view: FleetView, prefix: str | tuple[str, ...]) -> dict[str, float]:
        return {
            eid: view.keys[f"inference/{eid}/{GEN}"]
            for eid in view.engines
            if eid.startswith(prefix)
        }

    for view in (healthy, sick):
        pre, dec = rates(view, "server0."), rates(view, ("server1.", "server2."))
        k = view.keys
        if view is healthy:
            assert min(pre.values()) < min(dec.values())
        assert k[f"inference/prefill/{GEN}/min"] == min(pre.values())
        assert k[f"inference/decode/{GEN}/min"] == min(dec.values())
        assert k[f"inference/agg/{GEN}/min"] == min(dec.values())  # not a prefill engine's
        assert k[f"inference/agg/{GEN}/sum"] == pytest.approx(sum(pre.values()) + sum(dec.values()))
    assert min(rates(healthy, ("server1.", "server2.")).values()) > 0
    assert sick.keys[f"inference/decode/{GEN}/min"] == 0
    assert sick.keys[f"inference/server1.1/{GEN}"] == 0
    stalled = [e.subject for e in sick.result.events if e.condition == "generation_stalled"]
    assert stalled == ["server1.1"]
