"""The simulator's SGLang mode: SGLang 0.5.23 bodies on the catalog, with exact ground truth."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from typing import TypedDict

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetscope.catalog import FAMILY_BY_NAME
from fleetscope.exposition import Parser
from fleetscope.fleet.state import FleetState, PollResult
from fleetscope.identity import Role
from fleetscope.sources.base import ScrapeResult
from fleetscope_sim import FleetServer, LoadProfile, SglangEndpoint, SimEndpoint, SimFleet
from fleetscope_sim.ledger import SeriesKey
from fleetscope_sim.sglang_families import FAMILIES
from support.paths import DATA
from support.promql import promql_bucket_quantile

SG_DIR = DATA / "sglang-0.5.23"
REAL = {f["name"]: f for f in json.loads((SG_DIR / "families.json").read_text())}


def _samples(body: bytes) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
    ]


def _fleet(
    kind: str = "sglang", dp: int = 2, roles: Sequence[Role] | None = None, seconds: float = 20.0
) -> SimFleet:
    fleet = SimFleet.build(2 if roles is None else len(roles), dp=dp, roles=roles, seed=7,
                           engine_kind=kind, wall_start=1_795_970_000.0)  # fmt: skip
    fleet.run(seconds, dt=0.5)
    return fleet


def test_families_are_sglang_0_5_23s_and_rows_of_the_catalog() -> None:
    for spec in FAMILIES:
        real = REAL[spec.name]  # SGLang 0.5.23 defines it (families.json from its source)
        assert real["type"] == spec.kind and real["help"] == spec.help, spec.name
        if spec.buckets:
            assert tuple(real["buckets"]) == spec.buckets, spec.name
        row = FAMILY_BY_NAME[spec.name.removesuffix("_total")]
        assert row.engine == "sglang" and row.type == spec.kind
        if spec.label:
            assert spec.label in row.labels.split()


def test_body_looks_like_sglangs_and_both_renderers_agree() -> None:
    fleet = _fleet(dp=2)
    ep = fleet.endpoints[0]
    assert isinstance(ep, SglangEndpoint) and ep.mode == "multiprocess"
    body = ep.render()
    assert body == ep.render_fast(use_cache=False)
    samples = _samples(body)  # prometheus_client's own parser accepts it
    names = {n for n, _, _ in samples}
    assert not any(n.endswith("_created") or n.startswith(("process_", "python_")) for n in names)
    real_labels = None
    for name, labels, _ in samples:
        if name == "sglang:num_running_reqs":
            assert labels["dp_rank"] in ("0", "1") and labels["tp_rank"] == "0"
            assert labels["engine_type"] == "unified"
            assert set(labels) == {"dp_rank", "engine_type", "model_name", "moe_ep_rank",
                                   "pp_rank", "tp_rank"}  # fmt: skip
        if name == "sglang:prompt_tokens_total":
            assert "dp_rank" not in labels and labels["is_streaming"] in ("true", "false")
            real_labels = set(labels)
    # the tokenizer's labels are those of a real SGLang 0.5.23 body
    real = (SG_DIR / "dp2_after.prom").read_text()
    line = next(ln for ln in real.splitlines() if ln.startswith("sglang:prompt_tokens_total{"))
    assert real_labels == {kv.split("=")[0] for kv in line.split("{")[1].split("}")[0].split(",")}


def test_idle_server_has_constants_but_no_request_series() -> None:
    fleet = SimFleet.build(1, dp=1, engine_kind="sglang", seed=1)
    names = {n for n, _, _ in _samples(fleet.endpoints[0].render())}
    assert "sglang:max_total_num_tokens" in names and "sglang:context_len" in names
    assert "sglang:num_running_reqs" not in names  # log_stats gauges: after the first step
    assert not any(n.startswith("sglang:prompt_tokens") for n in names)  # created on use


class _Truth(TypedDict):
    gen: float
    retracted: list[float]


def _observe(
    fleet: SimFleet, steps: list[float]
) -> tuple[PollResult | None, list[dict[str, _Truth]]]:
    state = FleetState()
    parsers: dict[str, Parser] = {}
    res: PollResult | None = None
    truths: list[dict[str, _Truth]] = []
    for i, dt in enumerate(steps):
        fleet.run(dt, dt=0.5)
        t = fleet.clock.sim_time
        scrapes: list[ScrapeResult] = []
        for ep in fleet.endpoints:
            p = parsers.setdefault(ep.name, Parser())
            expo = p.parse(ep.render(), time=t, wall_time=fleet.clock.wall())
            scrapes.append(ScrapeResult(ep.name, expo, t, fleet.clock.wall(),
                                        engine_roles=expo.engine_roles))  # fmt: skip
        res = state.observe(scrapes)
        truths.append({
            ep.name: {
                "gen": ep.truth_total("sglang:generation_tokens_total")
                if ep.engine_kind == "sglang" else ep.truth_total("vllm:generation_tokens_total"),
                "retracted": [e.truth.counter("sglang:num_retracted_requests_total")
                              for e in ep.engines],
            }
            for ep in fleet.endpoints
        })  # fmt: skip
        del i
    return res, truths


def test_counters_and_gauges_match_the_ground_truth_dp1_and_dp2() -> None:
    fleet = SimFleet(seed=3)
    small = LoadProfile(num_gpu_blocks=40, arrival_rate=6.0)  # KV shortage: retractions
    fleet.add_endpoint(dp=1, engine_kind="sglang", load=small)  # server0: one replica
    fleet.add_endpoint(dp=2, engine_kind="sglang")  # server1: two replicas
    fleet.run(5.0)
    res, truths = _observe(fleet, [1.0, 12.0])
    assert res is not None
    before, after = truths
    agg = res.stats.scopes["agg"].metrics
    gen = sum(after[n]["gen"] - before[n]["gen"] for n in after)
    assert gen > 0 and agg["generation_tokens_total"]["delta"] == gen
    # dp=1: the tokenizer's counters are engine 0's; dp=2: the endpoint's (no dp_rank)
    rate = res.stats.engine("server0.0")["generation_tokens_total:rate"]
    assert rate == pytest.approx((after["server0"]["gen"] - before["server0"]["gen"]) / 12.0)
    assert "generation_tokens_total:rate" not in res.stats.engine("server1.0")
    retracted = sum(
        x - y
        for n in after
        for x, y in zip(after[n]["retracted"], before[n]["retracted"], strict=True)
    )
    assert retracted > 0 and agg["num_preemptions_total"]["delta"] == retracted
    # gauges per replica, exactly the scheduler's
    for ep in fleet.endpoints:
        for e in ep.engines:
            m = res.stats.engine(f"{ep.name}.{e.label}")
            assert m["num_requests_running"] == e.num_running
            assert m["num_requests_waiting"] == e.num_waiting
            assert m["kv_cache_usage_perc"] == e.used_blocks / e.total_blocks
    # queue time: one observation per request admitted, per replica, vs the truth
    for e in fleet.endpoint("server1").engines:
        h = e.truth.histogram("sglang:queue_time_seconds")
        assert h is not None and h.count > 0


def test_ttft_quantiles_and_hit_rate_over_a_dp2_server_follow_promql() -> None:
    fleet = SimFleet(seed=5)
    ep = fleet.add_endpoint(dp=2, engine_kind="sglang")
    fleet.run(4.0)
    t_ttft = ep.truth.histogram("sglang:time_to_first_token_seconds", "false")
    a = {k: dict(v) for k, v in _hist_truth(ep).items()}
    a_cached = ep.truth_total("sglang:cached_tokens_total")
    a_prompt = ep.truth_total("sglang:prompt_tokens_total")
    res, _ = _observe(fleet, [0.0, 10.0])
    assert t_ttft is not None
    assert res is not None
    b = _hist_truth(ep)
    pooled = [(le, sum(b[s][le] - a.get(s, {}).get(le, 0.0) for s in b)) for le in
              sorted(next(iter(b.values())))]  # fmt: skip
    agg = res.stats.scopes["agg"].metrics
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert agg["time_to_first_token_seconds"][label] == promql_bucket_quantile(q, pooled)
    assert agg["time_to_first_token_seconds"]["pooled_bounds"] == 18.0  # SGLang's own layout
    hit = (ep.truth_total("sglang:cached_tokens_total") - a_cached) / (
        ep.truth_total("sglang:prompt_tokens_total") - a_prompt
    )
    assert agg["prefix_cache_hit_rate"]["pooled"] == pytest.approx(hit, rel=1e-12)


def _hist_truth(ep: SimEndpoint) -> dict[SeriesKey, dict[float, float]]:
    """TTFT cumulative buckets per is_streaming child, from the endpoint's truth."""
    out: dict[SeriesKey, dict[float, float]] = {}
    for key, h in ep.truth.histograms.get("sglang:time_to_first_token_seconds", {}).items():
        out[key] = {float(k): float(v) for k, v in h.cumulative_by_bound().items()}
    return out


def test_pd_roles_come_from_engine_type_and_routes_answer_like_sglang() -> None:
    fleet = SimFleet.build(2, roles=["prefill", "decode"], engine_kind="sglang", seed=2)
    fleet.run(3.0)
    body = fleet.endpoint("decode0").render().decode()
    assert 'engine_type="decode"' in body and 'engine_type="unified"' not in body
    expo = Parser().parse(body)
    assert dict(expo.engine_roles) == {"0": "decode"}
    with FleetServer(fleet) as server:
        base = server.url("decode0")
        assert httpx.get(base + "/version").status_code == 404  # SGLang 0.5.23 has none
        info = httpx.get(base + "/server_info").json()
        assert info["version"] == "0.5.23"
        assert httpx.get(base + "/get_server_info").json()["version"] == "0.5.23"
        models = httpx.get(base + "/v1/models").json()["data"][0]
        assert models["owned_by"] == "sglang" and models["max_model_len"] == 512
        assert httpx.get(base + "/get_metrics_worker_info").status_code == 404


def test_mixed_fleet_alternates_kinds_and_vllm_serves_version() -> None:
    fleet = SimFleet.build(3, engine_kind="mixed", seed=1)
    assert [ep.engine_kind for ep in fleet.endpoints] == ["vllm", "sglang", "vllm"]
    with FleetServer(fleet) as server:
        assert httpx.get(server.url("server0") + "/version").json() == {"version": "0.32.0"}
    with pytest.raises(ValueError):
        SimFleet.build(1, engine_kind="trt")


def test_restart_resets_sglang_series_and_truth_keeps_counting() -> None:
    fleet = SimFleet.build(1, dp=1, engine_kind="sglang", seed=4)
    fleet.run(8.0)
    ep = fleet.endpoints[0]
    before = ep.truth_total("sglang:generation_tokens_total")
    assert before > 0 and ep.exported.counter("sglang:generation_tokens_total") == before
    ep.restart()
    assert ep.exported.counter("sglang:generation_tokens_total") == 0
    fleet.run(8.0)
    assert ep.truth_total("sglang:generation_tokens_total") > before
    assert math.isclose(
        ep.truth_total("sglang:generation_tokens_total"),
        before + ep.exported.counter("sglang:generation_tokens_total"),
    )


def test_simulate_cli_serves_a_mixed_fleet() -> None:
    from fleetscope_sim.server import serve_forever

    stop, ready, lines = threading.Event(), threading.Event(), []

    def log(line: str) -> None:
        lines.append(line)
        if len(lines) == 2:
            ready.set()

    t = threading.Thread(
        target=serve_forever,
        kwargs={"endpoints": 2, "stop_event": stop, "log": log, "engine_kind": "mixed"},
        daemon=True,
    )
    t.start()
    try:
        assert ready.wait(60)  # logged once the listeners are up
        assert [ln.split()[1] for ln in lines] == ["vllm", "sglang"]
        url = lines[1].split()[-1]
        assert "sglang:" in httpx.get(url).text
    finally:
        stop.set()
        t.join(10)
