"""Fast checks on the bodies ``make test-real`` scraped from real vLLM 0.32 servers.

The files in ``tests/data/real-vllm/`` (see its README) are a single-engine server and a
data-parallel-2 server (multiprocess mode), idle, under load and after a load whose exact size
is in ``load.json``. fleetscope must parse every one of them, and what it reads must agree with
vLLM's own invariants and with the load generator's counts.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from fleetscope.exposition import Parser, parse
from fleetscope.fleet.state import FleetState
from fleetscope.sources.base import ScrapeResult
from real import bodies as B
from support.paths import DATA

DATA = DATA / "real-vllm"
KINDS = {"single": {"0"}, "dp2": {"0", "1"}}
PHASES = ("idle", "load", "after")
FAMILIES = {
    "counter": [
        "vllm:prompt_tokens",
        "vllm:prompt_tokens_by_source",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
    ],
    "gauge": [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
    ],
    "histogram": [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:iteration_tokens_total",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ],
}
BODIES = [(k, p) for k in KINDS for p in PHASES]


def text(kind: str, phase: str) -> str:
    path = DATA / f"{kind}_{phase}.prom"
    assert path.is_file(), f"{path} is missing: regenerate with `make test-real SAVE_BODIES=1`"
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def load() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / "meta.json").read_text())["load"]
    return loaded


@pytest.mark.parametrize(("kind", "phase"), BODIES)
def test_fleetscope_parses_every_body(kind: str, phase: str) -> None:
    body = text(kind, phase)
    expo = parse(body)
    assert set(expo) == KINDS[kind]
    assert B.engines(body) == KINDS[kind]
    for fam in FAMILIES["counter"] + FAMILIES["histogram"]:
        assert B.types(body).get(fam) in ("counter", "histogram"), fam
    # what fleetscope read equals what the text says, series by series
    for e, snap in expo.items():
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
            assert snap.value(name) == B.by_engine(body, name)[e], name


@pytest.mark.parametrize(("kind", "phase"), BODIES)
def test_families_present(kind: str, phase: str) -> None:
    body = text(kind, phase)
    types = B.types(body)
    for typ, fams in FAMILIES.items():
        for fam in fams:
            assert types.get(fam) == typ, (fam, types.get(fam))
    names = {s.name for s in B.samples(body)}
    gauges_written = "vllm:num_requests_running" in names
    if kind == "dp2" and phase == "idle":
        # multiprocess mode: a gauge has no sample until a process sets it
        assert not gauges_written
        assert not any(n.endswith("_created") for n in names)
        assert not any(n.startswith("process_") for n in names)
    else:
        assert gauges_written
    if kind == "single":
        assert any(n.endswith("_created") for n in names)
        assert "process_start_time_seconds" in names


@pytest.mark.parametrize(("kind", "phase"), BODIES)
def test_vllm_invariants_per_engine(kind: str, phase: str) -> None:
    body = text(kind, phase)
    for e in KINDS[kind]:

        def v(name: str, e: str = e, **match: str) -> float:
            return B.total(body, name, engine=e, **match)

        prompt = v("vllm:prompt_tokens_total")
        assert prompt == v("vllm:prompt_tokens_by_source_total")
        assert v("vllm:prefix_cache_hits_total") == v(
            "vllm:prompt_tokens_by_source_total", source="local_cache_hit"
        )
        assert v("vllm:prefix_cache_hits_total") <= v("vllm:prefix_cache_queries_total")
        assert v("vllm:prompt_tokens_cached_total") == v("vllm:prefix_cache_hits_total")
        if phase != "load":  # under load, a request may be half recorded
            done = v("vllm:request_success_total")
            for fam in (
                "vllm:e2e_request_latency_seconds",
                "vllm:request_prompt_tokens",
                "vllm:request_generation_tokens",
                "vllm:time_to_first_token_seconds",
            ):
                assert v(fam + "_count") == done, fam
            assert v("vllm:request_prompt_tokens_sum") == prompt
            assert v("vllm:request_generation_tokens_sum") == v("vllm:generation_tokens_total")
        # every histogram: cumulative buckets, +Inf == _count
        for fam in B.histogram_families(body):
            bk = B.buckets(body, fam, engine=e)
            if not bk:
                continue
            counts = [bk[le] for le in sorted(bk)]
            assert counts == sorted(counts), fam
            assert bk[math.inf] == v(fam + "_count"), fam


@pytest.mark.parametrize("kind", KINDS)
def test_after_minus_idle_is_the_load(kind: str, load: dict[str, Any]) -> None:
    idle, after = text(kind, "idle"), text(kind, "after")
    sent = load[kind]

    def delta(name: str) -> float:
        return B.total(after, name) - B.total(idle, name)

    assert delta("vllm:request_success_total") == sent["sent"] == sent["ok"]
    assert delta("vllm:prompt_tokens_total") == sent["prompt_tokens"]
    assert delta("vllm:generation_tokens_total") == sent["completion_tokens"]
    assert delta("vllm:prefix_cache_hits_total") > 0


def _scrape(name: str, body: str, t: float, parser: Parser) -> ScrapeResult:
    return ScrapeResult(name, parser.parse(body, time=t, wall_time=1.8e9 + t), t, 1.8e9 + t)


def test_fleetscope_deltas_over_the_real_bodies(load: dict[str, Any]) -> None:
    """Idle -> load -> after through FleetState: the totals are the load, exactly; the first
    poll (DP server idle, no gauges) is only a baseline and warns about nothing."""
    state = FleetState()
    parsers = {k: Parser() for k in KINDS}
    sums: dict[str, float] = {}
    for i, phase in enumerate(PHASES):
        scrapes = [_scrape(k, text(k, phase), 10.0 * (i + 1), parsers[k]) for k in KINDS]
        res = state.observe(scrapes)
        assert {e for e in res.stats.engine_ids if "." in e} == {
            "single.0",
            "dp2.0",
            "dp2.1",
        }
        if i == 0:
            assert all(d.baseline_only for d in res.deltas.values())
            continue
        assert not res.restarts
        for m in ("prompt_tokens_total", "generation_tokens_total", "request_success_total"):
            sums[m] = sums.get(m, 0.0) + res.keys[f"inference/agg/{m}/delta"]
    total = {k: sum(load[s][k] for s in KINDS) for k in ("prompt_tokens", "completion_tokens")}
    assert sums["prompt_tokens_total"] == total["prompt_tokens"]
    assert sums["generation_tokens_total"] == total["completion_tokens"]
    assert sums["request_success_total"] == sum(load[s]["sent"] for s in KINDS)


def test_an_idle_engine_beside_busy_ones_is_not_an_outlier() -> None:
    """Real end-of-batch shape: the single server has finished (nothing running, 0 tok/s)
    while both DP engines still generate. Idle is not sick: no ``engine_outlier``."""
    from fleetscope.health import HealthMonitor, HealthThresholds

    state = FleetState()
    monitor = HealthMonitor(HealthThresholds(outlier_seconds=0.0))
    parsers = {k: Parser() for k in KINDS}
    polls = [("after", "idle"), ("after", "load")]  # single: done; dp2: idle -> busy
    for i, (single, dp2) in enumerate(polls):
        res = state.observe(
            [
                _scrape("single", text("single", single), 10.0 * (i + 1), parsers["single"]),
                _scrape("dp2", text("dp2", dp2), 10.0 * (i + 1), parsers["dp2"]),
            ]
        )
        events = monitor.evaluate(res, {e: None for e in res.stats.engine_ids})
    gen = {e: res.stats.engine(e).get("generation_tokens_total:rate") for e in res.stats.engine_ids}
    assert gen["dp2.0"] is not None and gen["dp2.1"] is not None, gen
    assert gen["single.0"] == 0.0 and gen["dp2.0"] > 0 and gen["dp2.1"] > 0, gen
    assert res.stats.engine("single.0")["num_requests_running"] == 0.0
    assert [e for e in events if e.condition == "engine_outlier"] == []
