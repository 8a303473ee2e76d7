"""Prometheus as the oracle: fleetscope's numbers equal PromQL's on the same scraped data.

A real Prometheus server and fleetscope's collector scrape the same simulated vLLM fleet. The
fleet is driven in frozen steps: after each step nothing changes until Prometheus has scraped the
new state (``wait_for_scrape_after`` gives the evaluation time ``T`` of that scrape) and
fleetscope has polled it. Between two frozen states T1 and T2, fleetscope's poll delta must equal
PromQL on the same samples (relative 1e-9):

* counter deltas ``sum(x @ T2) - sum(x @ T1)``, fleet-wide, per role (instance labels) and per
  engine;
* pooled ratios (prefix-cache hit rate = Δhits / Δqueries, share finished by ``length``) and
  histogram means (Δsum / Δcount);
* ``histogram_quantile(q, sum by (le) (x_bucket @ T2 - x_bucket @ T1))`` for q = 0.5, 0.9,
  0.99 and several histograms, per scope;
* mixed bucket layouts (one server's ``request_prompt_tokens`` stops at 1000, the other's at
  500): fleetscope equals ``histogram_quantile`` on the *intersection* of the bounds (only the
  shared ``le`` values queried) and differs from PromQL's union answer, as docs/rules.md §3.5
  demands.

The simulator always answers in text format 0.0.4, so Prometheus keeps the ``vllm:`` names.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.fleet.view import counter_increase
from fleetscope.identity import EngineId
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet
from fleetscope_sim.vllm_families import build_1_2_5_buckets
from support.prom import PrometheusServer

pytestmark = pytest.mark.slow

REL = 1e-9
SCRAPE_INTERVAL = 0.5
SCOPES = ("agg", "prefill", "decode")
COUNTERS = (
    "generation_tokens_total",
    "prompt_tokens_total",
    "request_success_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "external_prefix_cache_hits_total",
    "prompt_tokens_cached_total",
)
HISTOGRAMS = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "request_prompt_tokens",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
)
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
PROMPT = "vllm:request_prompt_tokens"


@dataclass
class Oracle:
    prom: PrometheusServer
    t1: float
    t2: float
    main: FleetView  # fleetscope's poll at T2 (its delta covers T1 -> T2)
    mixed: FleetView
    instances: dict[str, list[str]] = field(default_factory=dict)  # scope -> host:port
    engine_instance: dict[EngineId, tuple[str, str]] = field(
        default_factory=dict
    )  # id -> (inst, eng)

    def sel(self, scope: str, extra: str = "") -> str:
        """A label matcher for the endpoints of one scope (``mixed`` is the other fleet)."""
        pattern = "|".join(re.escape(i) for i in self.instances[scope])
        return "{" + f'job="fleet",instance=~`{pattern}`' + (f",{extra}" if extra else "") + "}"

    def delta(self, series: str) -> float:
        """PromQL's increase of ``sum(series)`` between the two frozen states."""
        return self.prom.query_value(
            f"sum({series} @ {self.t2:.3f}) - sum({series} @ {self.t1:.3f})"
        )

    def bucket_delta(self, family: str, matcher: str) -> str:
        b = f"{family}_bucket{matcher}"
        return f"sum by (le) ({b} @ {self.t2:.3f} - {b} @ {self.t1:.3f})"

    def quantile(self, q: float, family: str, matcher: str) -> float:
        return self.prom.query_value(
            f"histogram_quantile({q}, {self.bucket_delta(family, matcher)})"
        )


def _add(fleet: SimFleet, role: str | None, dp: int) -> None:
    fleet.add_endpoint(role=role, dp=dp)  # type: ignore[arg-type]


def _endpoints(fleet: SimFleet, server: FleetServer) -> list[Endpoint]:
    return [Endpoint(server.url(ep.name), ep.name, ep.role) for ep in fleet.endpoints]


def _host(url: str) -> str:
    return url.removeprefix("http://")


async def _drive(
    prom: PrometheusServer,
    fleets: list[SimFleet],
    servers: list[FleetServer],
) -> tuple[float, float, list[FleetView]]:
    collectors = [
        Collector(_endpoints(f, s), interval=3600.0, timeout=5.0)
        for f, s in zip(fleets, servers, strict=True)
    ]
    try:
        # frozen state 1: Prometheus scrapes it, then fleetscope polls it (its baseline)
        t1 = await asyncio.to_thread(prom.wait_for_scrape_after, time.time())
        for c in collectors:
            await c.poll()
        # frozen state 2
        fleets[0].run(20.0, dt=1.0)
        fleets[1].run(60.0, dt=1.0)
        t2 = await asyncio.to_thread(prom.wait_for_scrape_after, time.time())
        views = [await c.poll() for c in collectors]
    finally:
        for c in collectors:
            await c.stop(timeout=5.0)
    return t1, t2, views


@pytest.fixture(scope="module")
def oracle() -> Iterator[Oracle]:
    # the main fleet: a DP=2 server without role, a prefill/decode pair, a DP=2 decode server
    main = SimFleet(seed=11)
    for role, dp in ((None, 2), ("prefill", 1), ("decode", 1), ("decode", 2)):
        _add(main, role, dp)
    main.run(10.0, dt=1.0)
    # mixed layouts: server1 exports request_prompt_tokens with bounds up to 1000, not 500
    mixed = SimFleet(seed=12)
    _add(mixed, None, 1)
    _add(mixed, None, 1)
    mixed.endpoint("server1").change_buckets(PROMPT, build_1_2_5_buckets(1024))
    mixed.run(10.0, dt=1.0)

    with FleetServer(main) as s_main, FleetServer(mixed) as s_mixed:
        targets = [_host(u) for u in s_main.urls + s_mixed.urls]
        with PrometheusServer(targets, scrape_interval=SCRAPE_INTERVAL) as prom:
            t1, t2, (v_main, v_mixed) = asyncio.run(_drive(prom, [main, mixed], [s_main, s_mixed]))
            o = Oracle(prom, t1, t2, v_main, v_mixed)
            o.instances["agg"] = [_host(s_main.url(ep.name)) for ep in main.endpoints]
            for role in ("prefill", "decode"):
                o.instances[role] = [
                    _host(s_main.url(ep.name)) for ep in main.endpoints if ep.role == role
                ]
            o.instances["mixed"] = [_host(u) for u in s_mixed.urls]
            for ep in main.endpoints:
                for engine in ep.engines:
                    eid = EngineId(ep.name, engine.label)  # engine.engine_id, as a value
                    o.engine_instance[eid] = (_host(s_main.url(ep.name)), engine.label)
            yield o


def close(got: float | None, want: float) -> bool:
    return got is not None and math.isclose(got, want, rel_tol=REL, abs_tol=0.0)


# --------------------------------------------------------------------------- sanity of the setup


def test_prometheus_stored_the_vllm_names_and_every_engine(oracle: Oracle) -> None:
    sel = oracle.sel("agg")
    n = oracle.prom.query_value(f"count(vllm:generation_tokens_total{sel} @ {oracle.t2:.3f})")
    assert n == len(oracle.engine_instance) == 6
    assert oracle.main.keys["inference/agg/engines_reporting"] == 6
    assert oracle.main.keys["inference/agg/scrape_failures"] == 0
    # both frozen states were scraped by Prometheus and polled by fleetscope
    assert oracle.t2 > oracle.t1
    gen = oracle.delta(f"vllm:generation_tokens_total{sel}")
    assert gen > 1000  # a real interval, not an empty one


# ------------------------------------------------------------------------------ counter deltas


@pytest.mark.parametrize("scope", SCOPES)
def test_counter_deltas_equal_promql(oracle: Oracle, scope: str) -> None:
    keys = oracle.main.keys
    for counter in COUNTERS:
        want = oracle.delta(f"vllm:{counter}{oracle.sel(scope)}")
        got = keys.get(f"inference/{scope}/{counter}/delta")
        assert close(got, want), (scope, counter, got, want)
    for reason in ("stop", "length", "abort"):
        want = oracle.delta(
            f"vllm:request_success_total{oracle.sel(scope, f'finished_reason={reason!r}')}"
        )
        key = f"inference/{scope}/request_success_total{{finished_reason={reason}}}/delta"
        assert close(keys.get(key), want), (scope, reason, keys.get(key), want)


def test_per_engine_deltas_and_means_equal_promql(oracle: Oracle) -> None:
    for eid, (instance, engine) in oracle.engine_instance.items():
        matcher = "{" + f'instance="{instance}",engine="{engine}"' + "}"
        d = oracle.main.result.deltas[eid]
        for family in ("vllm:generation_tokens", "vllm:prompt_tokens", "vllm:request_success"):
            want = oracle.delta(f"{family}_total{matcher}")
            assert close(counter_increase(d, family), want), (eid, family)
        n = oracle.delta(f"vllm:time_to_first_token_seconds_count{matcher}")
        s = oracle.delta(f"vllm:time_to_first_token_seconds_sum{matcher}")
        got = oracle.main.keys.get(f"inference/{eid}/time_to_first_token_seconds:mean")
        assert close(got, s / n), (eid, got, s / n)


# -------------------------------------------------------------------- pooled ratios and means


@pytest.mark.parametrize("scope", SCOPES)
def test_pooled_ratios_equal_promql(oracle: Oracle, scope: str) -> None:
    keys = oracle.main.keys
    sel = oracle.sel(scope)
    ratios = {
        "prefix_cache_hit_rate": (
            "vllm:prefix_cache_hits_total",
            "vllm:prefix_cache_queries_total",
        ),
        "length_finished_share": (
            f"vllm:request_success_total{oracle.sel(scope, 'finished_reason=`length`')}",
            f"vllm:request_success_total{sel}",
        ),
    }
    if scope == "decode":
        ratios["external_prefix_cache_hit_rate"] = (
            "vllm:external_prefix_cache_hits_total",
            "vllm:external_prefix_cache_queries_total",
        )
    for name, (num, den) in ratios.items():
        num = num if "{" in num else num + sel
        den = den if "{" in den else den + sel
        want = oracle.delta(num) / oracle.delta(den)
        got = keys.get(f"inference/{scope}/{name}/pooled")
        assert close(got, want), (scope, name, got, want)


@pytest.mark.parametrize("scope", SCOPES)
def test_histogram_means_equal_promql(oracle: Oracle, scope: str) -> None:
    keys = oracle.main.keys
    sel = oracle.sel(scope)
    for hist in HISTOGRAMS:
        count = oracle.delta(f"vllm:{hist}_count{sel}")
        assert close(keys.get(f"inference/{scope}/{hist}/delta"), count), (scope, hist)
        got = keys.get(f"inference/{scope}/{hist}:mean/pooled")
        if count == 0:  # a prefill server has no inter-token latency: no value, never 0
            assert got is None, (scope, hist, got)
            continue
        want = oracle.delta(f"vllm:{hist}_sum{sel}") / count
        assert close(got, want), (scope, hist, got, want)


# ---------------------------------------------------------------------------------- quantiles


@pytest.mark.parametrize("scope", SCOPES)
def test_quantiles_equal_promql_histogram_quantile(oracle: Oracle, scope: str) -> None:
    keys = oracle.main.keys
    compared = 0
    for hist in HISTOGRAMS:
        for label, q in QUANTILES.items():
            want = oracle.quantile(q, f"vllm:{hist}", oracle.sel(scope))
            got = keys.get(f"inference/{scope}/{hist}/{label}")
            if math.isnan(want):  # no observations in the interval: PromQL NaN, no key
                assert got is None, (scope, hist, label, got)
                continue
            assert close(got, want), (scope, hist, label, got, want)
            compared += 1
    assert compared >= 12  # the comparisons are not vacuous


# ------------------------------------------------------------------------- mixed bucket layouts


def test_mixed_layouts_pool_on_the_intersection_of_bounds(oracle: Oracle) -> None:
    prom, sel = oracle.prom, oracle.sel("mixed")
    # the `le` strings Prometheus stored, per server: prometheus_client writes "500.0", "+Inf"
    rows = prom.query(f"count by (instance, le) ({PROMPT}_bucket{sel} @ {oracle.t2:.3f})")
    le_by_instance: dict[str, set[str]] = {}
    for row in rows:
        le_by_instance.setdefault(row["metric"]["instance"], set()).add(row["metric"]["le"])
    assert len(le_by_instance) == 2
    layouts = sorted(le_by_instance.values(), key=len)
    assert "500.0" in layouts[0] and "500" not in layouts[0] and "+Inf" in layouts[0]
    assert "1000.0" in layouts[1] and "1000.0" not in layouts[0]
    shared = {float(le) for le in layouts[0]} & {float(le) for le in layouts[1]}
    shared_strings = sorted({le for les in layouts for le in les if float(le) in shared})
    intersection = sel[:-1] + ",le=~`" + "|".join(re.escape(s) for s in shared_strings) + "`}"

    keys = oracle.mixed.keys
    # the interval really has its top 1 % above the shared bounds, where union and
    # intersection part ways
    total = oracle.delta(f"{PROMPT}_count{sel}")
    at_500 = oracle.delta(f"{PROMPT}_bucket{sel[:-1]},le='500.0'}}")
    assert at_500 < 0.99 * total
    for label, q in QUANTILES.items():
        want = oracle.quantile(q, PROMPT, intersection)
        got = keys.get(f"inference/agg/request_prompt_tokens/{label}")
        assert close(got, want), (label, got, want)
    union_p99 = oracle.quantile(0.99, PROMPT, sel)
    assert keys["inference/agg/request_prompt_tokens/p99"] == 500.0  # highest shared bound
    assert union_p99 == 1000.0  # PromQL's union: a bound only one server has
    # everything else about the two servers still agrees with PromQL
    assert close(keys.get("inference/agg/request_prompt_tokens/delta"), total)
    for label, q in QUANTILES.items():
        want = oracle.quantile(q, "vllm:time_to_first_token_seconds", sel)
        got = keys.get(f"inference/agg/time_to_first_token_seconds/{label}")
        assert close(got, want), (label, got, want)
