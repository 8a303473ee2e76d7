"""``PrometheusSource`` against a real Prometheus scraping the simulated fleet.

The fleet is stepped only between polls (frozen states), and each poll waits until Prometheus
has scraped the frozen state. A ``Collector(source=PrometheusSource(...))`` must then log the
same keys as a ``Collector`` scraping the endpoints directly, with identical values for every
key that does not depend on a clock (rates, their spread and scrape latency excluded); its
rates are increase / (difference of Prometheus' scrape timestamps of that target). A target that
goes down is a failed scrape (the baseline is kept: the next success is exact over the longer
interval). Names Prometheus stored as ``vllm_...`` (OpenMetrics' ``:`` -> ``_`` rewrite by
prometheus_client) are mapped back to ``vllm:``, and a family that appears after the metadata
was read is typed at once.

A missing ``prometheus`` binary fails these tests (never skipped).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, TypedDict

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetscope.collector.core import Collector
from fleetscope.exposition import Parser
from fleetscope.fleet.state import PollResult
from fleetscope.identity import EngineId, Role
from fleetscope.sources.base import ScrapeResult
from fleetscope.sources.http.source import Endpoint
from fleetscope.sources.prometheus import PrometheusSource
from fleetscope_sim import FleetServer, SimFleet
from support.prom import PrometheusError, PrometheusServer, serve_registry

SCRAPE_INTERVAL = 0.5
ROLES: list[Role | None] = ["prefill", "decode", "decode", None]
DP = [1, 2, 2, 1]  # dp=1: single-process exposition with `_created` samples
DOWN = "decode1"
GEN = "inference/agg/generation_tokens_total/delta"


def clock_dependent(key: str) -> bool:
    return (
        ":rate" in key  # rates and their spread (`.../x:rate/cv`)
        or "scrape_latency_seconds" in key
        or "/collector/" in key  # the collector's own poll time and load
        or key.endswith(("/generation_stalled", "/engine_outlier"))
    )


def compare(got: dict[str, float], want: dict[str, float], label: str) -> int:
    assert set(got) == set(want), (label, sorted(set(got) ^ set(want))[:20])
    n = 0
    for k, v in want.items():
        if clock_dependent(k):
            continue
        assert got[k] == v or (math.isnan(got[k]) and math.isnan(v)), (label, k, got[k], v)
        n += 1
    return n


def wait_for_state(prom: PrometheusServer, t: float, down: set[str], timeout: float = 30.0) -> None:
    """Every target scraped (started) after ``t``: ``down`` ones failed, the others succeeded."""
    deadline = time.monotonic() + timeout
    while True:
        up = {s["metric"]["instance"]: s["value"] for s in prom.query("up")}
        stamps = {s["metric"]["instance"]: s["value"] for s in prom.query("timestamp(up)")}
        if all(
            stamps.get(i, 0) > t and up.get(i) == (0.0 if i in down else 1.0) for i in prom.targets
        ):
            return
        if time.monotonic() > deadline:
            raise PrometheusError(f"targets not in state down={down} after {t}: {up} {stamps}")
        time.sleep(0.1)


def scrape_times(prom: PrometheusServer, instance: str) -> set[float]:
    return set(prom.scrape_times(window=120.0)[instance])


def check_rates(
    result: PollResult, prev: PollResult, prom: PrometheusServer, inst: dict[str, str]
) -> int:
    """rate = increase / (difference of this target's Prometheus scrape timestamps)."""
    stats, pstats = result.stats, prev.stats
    now = {sc.endpoint: sc for sc in result.scrapes}
    before = {sc.endpoint: sc for sc in prev.scrapes}
    checked = 0
    for i, eid in enumerate(stats.engine_ids):
        assert isinstance(eid, EngineId)  # (typed str in PollStats)
        endpoint = eid.endpoint
        if not stats.is_engine[i] or eid not in pstats.engine_ids:
            continue
        # the snapshot wall times are Prometheus' own scrape timestamps of that target (and
        # the monotonic times the same instants, on this process' clock)
        t1, t0 = now[endpoint].wall_time, before[endpoint].wall_time
        stored = scrape_times(prom, inst[endpoint])
        assert t1 in stored and t0 in stored, (eid, t0, t1)
        assert stats.seconds[i] == pytest.approx(t1 - t0, abs=1e-9)
        j = pstats.engine_ids.index(eid)
        for rate, total in (
            ("generation_tokens_total:rate", "generation_tokens_total"),
            ("prompt_tokens_total:rate", "prompt_tokens_total"),
            ("time_to_first_token_seconds:rate", "time_to_first_token_seconds_count"),
        ):
            r = stats.matrix[i, stats.columns.index(rate)]
            inc = (
                stats.matrix[i, stats.columns.index(total)]
                - pstats.matrix[j, pstats.columns.index(total)]
            )
            assert r == pytest.approx(inc / (t1 - t0), rel=1e-9, abs=1e-12), (eid, rate)
            checked += 1
    return checked


def test_prometheus_source_matches_direct_scraping() -> None:
    fleet = SimFleet(seed=5)
    for role, dp in zip(ROLES, DP, strict=True):
        fleet.add_endpoint(role=role, dp=dp)
    fleet.step(1.0)
    with FleetServer(fleet) as server:
        targets = [u.removeprefix("http://") for u in server.urls]
        names = {t: ep.name for t, ep in zip(targets, fleet.endpoints, strict=True)}
        roles = {t: ep.role for t, ep in zip(targets, fleet.endpoints, strict=True) if ep.role}
        inst = {v: k for k, v in names.items()}
        eps = [
            Endpoint(u, role=ep.role) for u, ep in zip(server.urls, fleet.endpoints, strict=True)
        ]
        with PrometheusServer(targets, scrape_interval=SCRAPE_INTERVAL) as prom:
            asyncio.run(_run(fleet, server, prom, eps, names, roles, inst))


async def _run(
    fleet: SimFleet,
    server: FleetServer,
    prom: PrometheusServer,
    eps: list[Endpoint],
    names: dict[str, str],
    roles: dict[str, Role],
    inst: dict[str, str],
) -> None:
    direct = Collector(eps, interval=5.0)
    source = PrometheusSource(prom.url, names=names, roles=roles)
    viaprom = Collector(source=source, interval=5.0)
    truth0 = fleet.truth_total("vllm:generation_tokens_total")
    totals = {"direct": 0.0, "prom": 0.0}
    history: list[tuple[PollResult, PollResult]] = []
    try:
        # baselines; a step; DOWN is down; it is back (after a step)
        for step in range(4):
            down: set[str] = set()
            if step in (1, 3):
                fleet.step(2.0)
            if step == 2:
                server.close_endpoint(DOWN)
                down = {inst[DOWN]}
            if step == 3:
                server.open_endpoint(DOWN)
            t = time.time()
            await asyncio.to_thread(wait_for_state, prom, t, down)
            a = (await direct.poll()).result
            b = (await viaprom.poll()).result
            history.append((a, b))
            assert [sc.endpoint for sc in b.scrapes] == [e.name for e in direct.endpoints]
            assert [sc.role for sc in b.scrapes] == ROLES
            assert compare(b.keys, a.keys, f"step {step}") > 500
            assert b.stats.engine_ids == a.stats.engine_ids  # same rows, same order
            totals["direct"] += a.keys.get(GEN, 0.0)
            totals["prom"] += b.keys.get(GEN, 0.0)
            failed = step == 2
            for k in (a.keys, b.keys):
                assert k["inference/agg/scrape_failures"] == float(failed)
                assert k["inference/decode/scrape_failures"] == float(failed)
                assert k["inference/agg/endpoints_reporting"] == len(eps) - failed
                assert k["inference/agg/engines_reporting"] == sum(DP) - 2 * failed
                assert (f"inference/{DOWN}.1/num_requests_running" in k) == (not failed)
            if failed:
                (sc,) = [sc for sc in b.scrapes if not sc.ok]
                assert sc.endpoint == DOWN and sc.error == "target down"
            # back after being down: DOWN's engines (DP, no start time) are doubted over that
            # interval by both paths (docs/bad-data.md, "Continuity without a start time")
            for r in (a, b):
                doubted = {e for e, d in r.deltas.items() if d.continuity_unknown and e.is_engine}
                assert doubted == (
                    {EngineId(DOWN, "0"), EngineId(DOWN, "1")} if step == 3 else set()
                )
            if step == 0:
                assert GEN not in b.keys
            elif step in (1, 3):
                assert b.keys[GEN] > 0
                n = check_rates(b, history[-2][1], prom, inst)
                assert n >= 3 * (sum(DP) - 2 * (step == 3))
        # the down target's increase is counted when it is back: run totals are exact
        want = fleet.truth_total("vllm:generation_tokens_total") - truth0
        assert totals == {"direct": want, "prom": want}
    finally:
        await direct.stop()
        await viaprom.stop()


def test_a_target_down_between_two_polls_is_a_doubt_on_the_next() -> None:
    """Our polls never see the DP target down, but Prometheus scraped it while it was
    (``up`` 0 in between): its engines, with no start time, are not vouched for over that
    interval; a single-process target beside it (start time) is, and both count exactly."""
    fleet = SimFleet(seed=5)
    dp = fleet.add_endpoint(role="decode", dp=2)
    single = fleet.add_endpoint(role="decode", dp=1)
    fleet.step(1.0)
    with FleetServer(fleet) as server:
        targets = [u.removeprefix("http://") for u in server.urls]
        names = {t: ep.name for t, ep in zip(targets, fleet.endpoints, strict=True)}
        inst = {v: k for k, v in names.items()}
        with PrometheusServer(targets, scrape_interval=SCRAPE_INTERVAL) as prom:
            source = PrometheusSource(prom.url, names=names)
            truth0: list[float] = []

            async def run() -> PollResult:
                c = Collector(source=source, interval=5.0)
                try:
                    await asyncio.to_thread(wait_for_state, prom, time.time(), set())
                    await c.poll()
                    truth0.append(fleet.truth_total("vllm:generation_tokens_total"))
                    fleet.step(2.0)
                    server.close_endpoint(dp.name)  # down for a scrape or more, unseen by us
                    t = time.time()
                    await asyncio.to_thread(wait_for_state, prom, t, {inst[dp.name]})
                    server.open_endpoint(dp.name)
                    await asyncio.to_thread(wait_for_state, prom, time.time(), set())
                    return (await c.poll()).result
                finally:
                    await c.stop()

            r = asyncio.run(run())
    doubted = {e for e, d in r.deltas.items() if d.continuity_unknown and e.is_engine}
    assert doubted == {EngineId(dp.name, "0"), EngineId(dp.name, "1")}
    assert all(sc.ok for sc in r.scrapes)
    # no restart happened: every count is there (the doubt is about what could have hidden)
    assert r.keys[GEN] == fleet.truth_total("vllm:generation_tokens_total") - truth0[0] > 0
    assert single.name not in {e.endpoint for e in doubted}


# ----------------------------------------------------------------------------- vllm_ names


class _Metrics(TypedDict):
    success: Counter
    gen: Counter
    running: Gauge
    ttft: Histogram


def _registry() -> tuple[CollectorRegistry, _Metrics]:
    reg = CollectorRegistry()
    m: _Metrics = {
        "success": Counter(
            "vllm:request_success",
            "Finished requests.",
            ["engine", "finished_reason"],
            registry=reg,
        ),
        "gen": Counter("vllm:generation_tokens", "Generated tokens.", ["engine"], registry=reg),
        "running": Gauge("vllm:num_requests_running", "Running.", ["engine"], registry=reg),
        "ttft": Histogram(
            "vllm:time_to_first_token_seconds",
            "TTFT.",
            ["engine"],
            buckets=[0.01, 0.1, 1.0],
            registry=reg,
        ),
    }
    return reg, m


def _drive(m: _Metrics, k: int) -> None:
    for e in ("0", "1"):
        m["success"].labels(e, "stop").inc(3 + k)
        m["success"].labels(e, "length").inc(1)
        m["gen"].labels(e).inc(100 * (k + 1) + int(e))
        m["running"].labels(e).set(k + int(e))
        for v in (0.005, 0.05, 0.5 + k, 2.0):
            m["ttft"].labels(e).observe(v)


def test_openmetrics_underscore_names_map_back_and_new_families_are_typed() -> None:
    """One registry served twice: as OpenMetrics (Prometheus stores ``vllm_...``) and as
    classic text (``vllm:...``); both targets read through Prometheus give the same per-engine
    values as scraping the classic one directly. A counter family registered mid-run is a
    counter from its first poll (no waiting for the next metadata refresh)."""
    reg, m = _registry()
    _drive(m, 0)
    with (
        serve_registry(reg, force_text_format=False) as om,
        serve_registry(reg) as classic,
        PrometheusServer([om.target, classic.target], scrape_interval=SCRAPE_INTERVAL) as prom,
    ):
        prom.wait_for_scrape_after(time.time())
        stored = {s["metric"]["__name__"] for s in prom.query(f'{{instance="{om.target}"}}')}
        assert "vllm_generation_tokens_total" in stored  # the rewrite really happened
        assert not any(n.startswith("vllm:") for n in stored)
        names = {om.target: "om", classic.target: "classic"}
        asyncio.run(_run_names(prom, names, classic.url, reg, m))


async def _run_names(
    prom: PrometheusServer,
    names: dict[str, str],
    classic_url: str,
    reg: CollectorRegistry,
    m: _Metrics,
) -> None:
    source = PrometheusSource(prom.url, names=names, metadata_every=1000)
    viaprom = Collector(source=source, interval=5.0)
    direct = Collector([Endpoint(classic_url, name="classic")], interval=5.0)
    late: Counter | None = None
    try:
        for k in range(3):
            if k:
                _drive(m, k)
            if k == 1:  # a family the metadata fetched at the first poll does not know
                late = Counter("vllm:num_preemptions", "Preemptions.", ["engine"], registry=reg)
            if late is not None:
                late.labels("0").inc(2 * k)
            await asyncio.to_thread(prom.wait_for_scrape_after, time.time())
            a = (await direct.poll()).result
            b = (await viaprom.poll()).result
            assert [sc.endpoint for sc in b.scrapes] == ["om", "classic"]
            assert all(sc.ok for sc in b.scrapes), [sc.error for sc in b.scrapes]
            ka, kb = a.keys, b.keys
            per_engine = {k_: v for k_, v in ka.items() if k_.startswith("inference/classic.")}
            assert any(k_.endswith("/generation_tokens_total") for k_ in per_engine)
            assert any(
                k_.endswith("/request_success_total{finished_reason=length}") for k_ in per_engine
            )
            for key, v in per_engine.items():
                if clock_dependent(key):
                    continue
                assert kb[key] == v, key  # classic target through Prometheus
                assert kb[key.replace("/classic.", "/om.")] == v, key  # vllm_ target
            if k:
                assert (
                    kb["inference/agg/generation_tokens_total/delta"]
                    == 2 * ka["inference/agg/generation_tokens_total/delta"]
                )
                assert (
                    kb["inference/agg/time_to_first_token_seconds/p90"]
                    == ka["inference/agg/time_to_first_token_seconds/p90"]
                )
            if k == 1:
                # counted from 0 when it appears (it started after the previous poll)
                assert ka["inference/agg/num_preemptions_total/delta"] == 2.0
                assert kb["inference/agg/num_preemptions_total/delta"] == 4.0  # both targets
            if k == 2:
                assert kb["inference/agg/num_preemptions_total/delta"] == 8.0
    finally:
        await direct.stop()
        await viaprom.stop()


def test_render_maps_underscore_names_back() -> None:
    """``_render`` of samples stored as ``vllm_...`` gives a body parsed exactly like the
    ``vllm:`` original (types from metadata; bucket order from Prometheus does not matter)."""
    src = PrometheusSource("http://127.0.0.1:9")
    src._types = {
        "vllm:request_success": "counter",  # OpenMetrics family names drop `_total`
        "vllm:num_requests_running": "gauge",
        "vllm:time_to_first_token_seconds": "histogram",
    }

    def s(name: str, value: str, **labels: str) -> dict[str, Any]:
        return {
            "metric": {"__name__": name, "instance": "h:1", "job": "fleet", **labels},
            "value": [1.0, value],
        }

    samples = [
        s("vllm_request_success_total", "7", engine="0", finished_reason="stop"),
        s("vllm_request_success_created", "1700000000.5", engine="0", finished_reason="stop"),
        s("vllm_num_requests_running", "3", engine="0"),
        s("vllm_time_to_first_token_seconds_bucket", "4", engine="0", le="+Inf"),
        s("vllm_time_to_first_token_seconds_bucket", "1", engine="0", le="0.1"),
        s("vllm_time_to_first_token_seconds_bucket", "3", engine="0", le="1.0"),
        s("vllm_time_to_first_token_seconds_count", "4", engine="0"),
        s("vllm_time_to_first_token_seconds_sum", "2.5", engine="0"),
    ]
    text = src._render(samples)
    assert "vllm_" not in text
    got = Parser().parse(text, time=1.0, wall_time=1.0)["0"]
    original = (
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{engine="0",finished_reason="stop"} 7.0\n'
        'vllm:request_success_created{engine="0",finished_reason="stop"} 1700000000.5\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3.0\n'
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 1.0\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0"} 3.0\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 4.0\n'
        'vllm:time_to_first_token_seconds_count{engine="0"} 4.0\n'
        'vllm:time_to_first_token_seconds_sum{engine="0"} 2.5\n'
    )
    want = Parser().parse(original, time=1.0, wall_time=1.0)["0"]
    assert dict(got) == dict(want)
    assert [c.name for c in got.layout.counters] == [c.name for c in want.layout.counters]
    assert [(h.name, h.bounds) for h in got.layout.histograms] == [
        (h.name, h.bounds) for h in want.layout.histograms
    ]
    assert got.start_time == want.start_time


def test_a_target_scraped_while_reading_is_read_again() -> None:
    """Values and times come from one scrape: every query is evaluated at one time, and a
    target whose scrape time moved between the reads of ``timestamp(up)`` is read again."""
    seen_times: list[str] = []
    calls = {"stamps": 0}

    def vector(rows: list[tuple[dict[str, str], float]]) -> httpx.Response:
        result = [{"metric": m, "value": [1.0, repr(v)]} for m, v in rows]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/metadata":
            meta = {"vllm:generation_tokens_total": [{"type": "counter"}]}
            return httpx.Response(200, json={"status": "success", "data": meta})
        q = request.url.params["query"]
        seen_times.append(request.url.params.get("time"))
        target = {"instance": "h:1", "job": "j"}
        if q == "up":
            return vector([({"__name__": "up", **target}, 1.0)])
        if q == "timestamp(up)":
            calls["stamps"] += 1  # a scrape at 101.0 lands between the two reads
            return vector([(target, 100.0 if calls["stamps"] == 1 else 101.0)])
        metric = {"__name__": "vllm:generation_tokens_total", "engine": "0", **target}
        if "instance=~" in q:  # the re-read sees the new scrape
            assert 'instance=~"h:1"' in q, q
            return vector([(metric, 7.0)])
        assert q.startswith("{__name__="), q
        return vector([(metric, 5.0)])

    async def run() -> list[ScrapeResult]:
        src = PrometheusSource("http://prom:9090", names={"h:1": "server0"})
        src._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        try:
            return await src.scrape()
        finally:
            await src.aclose()

    (sc,) = asyncio.run(run())
    assert sc.ok and sc.endpoint == "server0"
    assert sc.wall_time == 101.0  # the target's own scrape time (time: this clock's)
    assert sc.exposition is not None
    assert sc.exposition["0"].value("vllm:generation_tokens_total") == 7.0
    assert len(set(seen_times)) == 1 and seen_times[0] is not None  # one evaluation time
