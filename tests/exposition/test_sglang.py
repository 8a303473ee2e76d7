"""SGLang 0.5.23 bodies (tests/data/sglang-0.5.23, made by SGLang's own metrics code) against
their driven truth (``truth.json``): engines, TP/DP ranks, the vLLM-name mapping, roles, and a
mixed vLLM + SGLang fleet (docs/sglang.md).

The expectations are computed here from ``truth.json`` with the rules spelled out in the test
(tp rank 0 only, dp_rank = engine, the mapping table below), not from fleetscope's catalog.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence

import numpy as np
import pytest

from fleetscope.exposition import Exposition, Parser, parse
from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.fleet.state import FleetState, PollResult
from fleetscope.identity import Role
from fleetscope.sources.base import ScrapeResult
from support.paths import DATA, VLLM_DIR
from support.promql import promql_bucket_quantile

SG = DATA / "sglang-0.5.23"
TRUTH = json.loads((SG / "truth.json").read_text())
WALL = 1_795_970_000.0

# exposed SGLang family -> the name fleetscope parses it as (tests/data/sglang-0.5.23/README.md)
MAPPED = {
    "sglang:num_running_reqs": "vllm:num_requests_running",
    "sglang:num_queue_reqs": "vllm:num_requests_waiting",
    "sglang:full_token_usage": "vllm:kv_cache_usage_perc",
    "sglang:num_retracted_requests_total": "vllm:num_preemptions_total",
    "sglang:queue_time_seconds": "vllm:request_queue_time_seconds",
    "sglang:time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "sglang:e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
    "sglang:request_time_per_output_token_seconds": "vllm:request_time_per_output_token_seconds",
    "sglang:prompt_tokens_total": "vllm:prompt_tokens_total",
    "sglang:generation_tokens_total": "vllm:generation_tokens_total",
    "sglang:estimated_flops_per_gpu_total": "vllm:estimated_flops_per_gpu_total",
}
RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")
# a truth series: a sample name, or (histogram family, bucket bound)
SeriesKey = str | tuple[str, float]


def body(name: str) -> str:
    return (SG / name).read_text()


def truth_engine(name: str, labels: dict[str, str], several_dp: bool) -> str | None:
    """The engine a truth series belongs to ("" = the endpoint); None = a repeated rank."""
    if any(labels.get(k, "0") != "0" for k in RANKS):
        return None  # every scheduler rank of a replica writes the same series: rank 0 counts
    if "dp_rank" in labels:
        # radix-cache families give every replica dp_rank 0 without DP attention (merged)
        if several_dp and "cache_type" in labels:
            return ""
        return labels["dp_rank"]
    return "" if several_dp else "0"


def truth_totals(case: str) -> dict[tuple[str, SeriesKey], float]:
    """(engine, series) -> value, for the mapped families, summed over their labels."""
    t = TRUTH[case]
    several = (t["case"].get("dp") or 1) > 1
    out: dict[tuple[str, SeriesKey], float] = {}

    def add(eng: str, sid: SeriesKey, v: float) -> None:
        out[(eng, sid)] = out.get((eng, sid), 0.0) + v

    for kind in ("counters", "gauges"):
        for s in t[kind]:
            if s["name"] in MAPPED:
                eng = truth_engine(s["name"], s["labels"], several)
                if eng is not None:
                    add(eng, MAPPED[s["name"]], s["value"])
    for h in t["histograms"]:
        if h["name"] in MAPPED:
            eng = truth_engine(h["name"], h["labels"], several)
            if eng is None:
                continue
            fam = MAPPED[h["name"]]
            add(eng, fam + "_count", h["count"])
            add(eng, fam + "_sum", h["sum"])
            for le, c in h["buckets"]:
                add(eng, (fam, math.inf if le == "+Inf" else float(le)), c)
    return out


def hist(sn: EngineSnapshot, family: str) -> dict[float, float]:
    hs = [h for h in sn.layout.histograms if h.name == family and not h.labels]
    assert len(hs) == 1, family
    return {b: float(sn.data[s]) for b, s in zip(hs[0].bounds, hs[0].buckets, strict=True)}


def parsed_value(expo: Exposition, eng: str, key: SeriesKey) -> float | None:
    sn = expo.endpoint if eng == "" else expo.get(eng)
    if sn is None:
        return None
    if isinstance(key, tuple):
        return hist(sn, key[0]).get(key[1])
    return sn.value(key)


CASES = [
    "single_after.prom",
    "single_idle.prom",
    "dp2_after.prom",
    "dp2_idle.prom",
    "all_tp_ranks_after.prom",
    "tp2_default_after.prom",
    "pd_prefill_after.prom",
    "pd_decode_after.prom",
    "custom_buckets_after.prom",
]


@pytest.mark.parametrize("case", CASES)
def test_every_mapped_per_engine_value_equals_the_truth(case: str) -> None:
    expo = parse(body(case))
    want = truth_totals(case)
    assert want
    for (eng, key), v in want.items():
        assert parsed_value(expo, eng, key) == pytest.approx(v, rel=1e-12, abs=1e-12), (eng, key)


@pytest.mark.parametrize("case", CASES)
def test_engines_are_dp_replicas(case: str) -> None:
    expo = parse(body(case))
    dp = TRUTH[case]["case"].get("dp") or 1
    assert sorted(expo) == [str(i) for i in range(dp)]
    if dp == 1:
        assert expo.endpoint is None  # everything belongs to the one engine
    else:
        # the tokenizer's families have no dp_rank: the endpoint's, never split
        ep = expo.endpoint
        assert ep is not None
        ttft = [
            h["count"]
            for h in TRUTH[case]["histograms"]
            if h["name"] == "sglang:time_to_first_token_seconds"
        ]
        want = sum(ttft) if ttft else None
        assert ep.value("vllm:time_to_first_token_seconds_count") == want
        assert ep.value("sglang:startup_time_seconds", phase="load_weight") is not None
        for e in expo:
            assert expo[e].value("vllm:time_to_first_token_seconds_count") is None


def test_tp_repeats_counted_once() -> None:
    single = parse(body("single_after.prom"))["0"]
    for case in ("all_tp_ranks_after.prom", "tp2_default_after.prom"):
        sn = parse(body(case))["0"]
        t = {
            (s["name"], s["labels"].get("tp_rank")): s["value"]
            for s in TRUTH[case]["gauges"] + TRUTH[case]["counters"]
            if not set(s["labels"]) - {"model_name", "engine_type", *RANKS}
        }
        for name in ("sglang:max_total_num_tokens", "sglang:num_pages", "sglang:context_len"):
            assert sn.value(name) == t[(name, "0")] == single.value(name)
        assert sn.value("vllm:num_requests_running") == 3
        assert sn.value("sglang:token_usage") == pytest.approx(0.01)
        idle = "sglang:scheduler_idle_seconds_total"
        assert sn.value(idle) == t[(idle, "0")]
    # with every scheduler logging, the scheduler counters of tp1 repeat tp0's exactly
    sn = parse(body("all_tp_ranks_after.prom"))["0"]
    modes = {"prefill_compute", "prefill_cache", "decode"}
    rt = {
        s["labels"]["mode"]: s["value"]
        for s in TRUTH["all_tp_ranks_after.prom"]["counters"]
        if s["name"] == "sglang:realtime_tokens_total" and s["labels"]["tp_rank"] == "0"
    }
    assert set(rt) == modes
    for m in modes:
        assert sn.value("sglang:realtime_tokens_total", mode=m) == rt[m]
    assert sn.value("sglang:realtime_tokens_total") is None  # a breakdown: no summed series


def test_dp2_ratio_gauges_and_constants_are_per_replica() -> None:
    expo = parse(body("dp2_after.prom"))
    t = TRUTH["dp2_after.prom"]
    for name in ("sglang:token_usage", "sglang:max_total_num_tokens", "sglang:utilization"):
        for s in t["gauges"]:
            if s["name"] == name:
                assert expo[s["labels"]["dp_rank"]].value(name) == s["value"]
    # radix-cache families: dp_rank 0 on both replicas (merged by SGLang): the endpoint's
    ev = [s for s in t["counters"] if s["name"] == "sglang:evicted_tokens_total"]
    assert ev[0].get("merged_from_processes") == 2
    assert expo.endpoint is not None
    assert expo.endpoint.value("sglang:evicted_tokens_total") == ev[0]["value"]
    assert expo["0"].value("sglang:evicted_tokens_total") is None


def test_kv_usage_is_full_token_usage_and_token_usage_keeps_its_name() -> None:
    sn = parse(body("single_after.prom"))["0"]
    g = {s["name"]: s["value"] for s in TRUTH["single_after.prom"]["gauges"]}
    assert sn.value("vllm:kv_cache_usage_perc") == g["sglang:full_token_usage"]
    assert sn.value("sglang:token_usage") == g["sglang:token_usage"]
    assert sn.value("sglang:full_token_usage") is None
    # without full_token_usage (older servers), token_usage is the KV usage
    text = "\n".join(
        ln for ln in body("single_after.prom").split("\n") if "sglang:full_token_usage" not in ln
    )
    sn = parse(text)["0"]
    assert sn.value("vllm:kv_cache_usage_perc") == g["sglang:token_usage"]
    assert sn.value("sglang:token_usage") is None


def test_itl_is_not_merged_and_breakdowns_survive() -> None:
    sn = parse(body("single_after.prom"))["0"]
    names = {h.name for h in sn.layout.histograms}
    assert "sglang:inter_token_latency_seconds" in names
    assert "vllm:inter_token_latency_seconds" not in names
    stages = {dict(h.labels).get("stage") for h in sn.layout.histograms if "per_stage" in h.name}
    assert {"prefill_waiting"} <= stages
    t = TRUTH["single_after.prom"]
    for s in t["counters"]:
        if s["name"] == "sglang:cached_tokens_total":
            src = s["labels"]["cache_source"]
            assert sn.value("sglang:cached_tokens_total", cache_source=src) == s["value"]
    phases = [s for s in t["gauges"] if s["name"] == "sglang:startup_time_seconds"]
    for s in phases:
        assert sn.value("sglang:startup_time_seconds", phase=s["labels"]["phase"]) == s["value"]


def test_renames_inside_0_5() -> None:
    text = body("single_after.prom").replace(
        "sglang:num_prefill_inflight_queue_reqs", "sglang:num_prefill_infight_queue_reqs"
    )
    sn = parse(text)["0"]
    assert sn.value("sglang:num_prefill_inflight_queue_reqs") is not None
    assert sn.value("sglang:num_prefill_infight_queue_reqs") is None
    old = (
        "# HELP sglang:avg_request_queue_latency x\n# TYPE sglang:avg_request_queue_latency gauge\n"
        'sglang:avg_request_queue_latency{model_name="m",engine_type="unified",tp_rank="0",'
        'pp_rank="0"} 0.25\n'
    )
    sn = parse(old)["0"]
    assert sn.value("sglang:avg_request_queue_latency") == 0.25  # a gauge stays a gauge
    assert not sn.layout.histograms


def test_the_0_5_2_queue_time_histogram_is_request_queue_time() -> None:
    """SGLang 0.5.2 named its queue-time histogram ``queue_time_s``: parsed as vLLM's request
    queue time, like 0.5.23's ``queue_time_seconds``; with both present, the current one wins."""
    text = body("single_after.prom")
    assert "sglang:queue_time_seconds_count" in text
    native = parse(text)["0"]
    old = parse(text.replace("sglang:queue_time_seconds", "sglang:queue_time_s"))["0"]
    for suffix in ("_count", "_sum", '_bucket{le="+Inf"}'):
        name = "vllm:request_queue_time_seconds" + suffix
        assert old[name] == native[name] > 0, name
    assert not [s for s in old if s.startswith("sglang:queue_time")]
    both = (
        text
        + "# TYPE sglang:queue_time_s histogram\n"
        + "\n".join(
            line.replace("sglang:queue_time_seconds", "sglang:queue_time_s").replace(
                line.rsplit(" ", 1)[-1], "999.0"
            )
            for line in text.split("\n")
            if line.startswith("sglang:queue_time_seconds")
        )
        + "\n"
    )
    both = both.replace("# EOF\n", "")
    assert (
        parse(both)["0"]["vllm:request_queue_time_seconds_count"]
        == native["vllm:request_queue_time_seconds_count"]
    )


def test_roles_from_engine_type() -> None:
    assert parse(body("pd_prefill_after.prom")).engine_roles == {"0": "prefill"}
    assert parse(body("pd_decode_after.prom")).engine_roles == {"0": "decode"}
    assert parse(body("single_after.prom")).engine_roles == {}
    vllm = (VLLM_DIR / "single_after.prom").read_text()
    assert parse(vllm).engine_roles == {}


def test_http_source_passes_engine_roles_and_explicit_role_wins() -> None:
    from fleetscope.sources.http.source import Endpoint, HttpSource
    from fleetscope.sources.http.wire import Response

    text = body("pd_prefill_after.prom")

    class Source(HttpSource):
        async def _fetch(self, ep: Endpoint) -> Response:
            return Response(200, {}, text.encode())

    async def run(role: Role | None) -> ScrapeResult:
        src = Source([Endpoint("http://p:1", "p", role=role)], discover_roles=False)
        try:
            return await src.scrape_one(src.endpoints[0])
        finally:
            await src.aclose()

    r = asyncio.run(run(None))
    assert r.ok and r.engine_roles == {"0": "prefill"}
    r = asyncio.run(run("decode"))
    assert r.ok and r.engine_roles == {} and r.role == "decode"


def test_fast_path_reuses_the_template_with_the_same_result() -> None:
    p = Parser(share_templates=False)
    a = p.parse(body("all_tp_ranks_after.prom"))
    b = p.parse(body("all_tp_ranks_after.prom"))
    assert p.fast_hits == 1 and p.full_parses == 1
    assert a["0"].layout is b["0"].layout
    assert np.array_equal(a["0"].data, b["0"].data, equal_nan=True)
    assert b.engine_roles == a.engine_roles


# --------------------------------------------------------------------------- a mixed fleet


def observe_polls(polls: Sequence[tuple[float, dict[str, str]]]) -> PollResult:
    state = FleetState()
    parsers: dict[str, Parser] = {}
    res: PollResult | None = None
    for t, bodies in polls:
        scrapes: list[ScrapeResult] = []
        for name, text in bodies.items():
            p = parsers.setdefault(name, Parser())
            expo = p.parse(text, time=t, wall_time=WALL + t)
            scrapes.append(ScrapeResult(name, expo, t, WALL + t, engine_roles=expo.engine_roles))
        res = state.observe(scrapes)
    assert res is not None
    return res


def _buckets(text: str, family: str, engine: str | None) -> dict[float, float]:
    """Cumulative buckets of ``family`` summed over the children of one engine, from the text."""
    out: dict[float, float] = {}
    for ln in text.split("\n"):
        if not ln.startswith(family + "_bucket{"):
            continue
        if engine is not None and f'engine="{engine}"' not in ln:
            continue
        le = ln.split('le="', 1)[1].split('"', 1)[0]
        b = math.inf if le == "+Inf" else float(le)
        out[b] = out.get(b, 0.0) + float(ln.rsplit(" ", 1)[1])
    return out


def test_mixed_fleet_ttft_quantiles_pool_on_shared_bounds_and_counters_are_exact() -> None:
    v_idle = (VLLM_DIR / "dp2_idle.prom").read_text()
    v_after = (VLLM_DIR / "dp2_load.prom").read_text()
    s_idle = body("single_idle.prom")
    s_after = body("single_after.prom")
    d_idle, d_after = body("dp2_idle.prom"), body("dp2_after.prom")
    res = observe_polls(
        [
            (0.0, {"v": v_idle, "s": s_idle, "d": d_idle}),
            (30.0, {"v": v_after, "s": s_after, "d": d_after}),
        ]
    )
    agg = res.stats.scopes["agg"].metrics
    # bucket deltas per engine, from the text: vLLM engines 0, 1; the SGLang engine; the dp2
    # SGLang endpoint (its TTFT has no dp_rank)
    deltas = []
    for e in "01":
        a = _buckets(v_idle, "vllm:time_to_first_token_seconds", e)
        b = _buckets(v_after, "vllm:time_to_first_token_seconds", e)
        deltas.append({k: b[k] - a[k] for k in b})
    for idle, after in ((s_idle, s_after), (d_idle, d_after)):
        a = _buckets(idle, "sglang:time_to_first_token_seconds", None)
        b = _buckets(after, "sglang:time_to_first_token_seconds", None)
        deltas.append({k: b[k] - a.get(k, 0.0) for k in b})
    shared = set.intersection(*(set(d) for d in deltas))
    assert math.inf in shared and len(shared) < min(len(d) for d in deltas)
    pooled = [(k, sum(d[k] for d in deltas)) for k in sorted(shared)]
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert agg["time_to_first_token_seconds"][label] == promql_bucket_quantile(q, pooled)

    def total(text: str, fam: str, engine: str | None = None) -> float:
        return sum(
            float(ln.rsplit(" ", 1)[1])
            for ln in text.split("\n")
            if ln.startswith(fam + "{") and (engine is None or f'engine="{engine}"' in ln)
        )

    gen = sum(
        total(v_after, "vllm:generation_tokens_total", e)
        - total(v_idle, "vllm:generation_tokens_total", e)
        for e in "01"
    )
    for idle, after in ((s_idle, s_after), (d_idle, d_after)):
        gen += total(after, "sglang:generation_tokens_total") - total(
            idle, "sglang:generation_tokens_total"
        )
    assert agg["generation_tokens_total"]["delta"] == gen
    rate = agg["generation_tokens_total:rate"]
    assert rate["sum"] == pytest.approx(gen / 30)
    # running: 2 vLLM engines, 1 single SGLang engine, 2 SGLang DP replicas
    running = agg["num_requests_running"]
    want = [total(v_after, "vllm:num_requests_running", e) for e in "01"] + [3.0, 3.0, 3.0]
    assert running["sum"] == sum(want)
    assert res.stats.scopes["agg"].engines == 5
    # the prefix-cache hit rate pools vLLM's hits/queries with SGLang's cached/prompt tokens
    num = den = 0.0
    for e in "01":
        num += total(v_after, "vllm:prefix_cache_hits_total", e)
        num -= total(v_idle, "vllm:prefix_cache_hits_total", e)
        den += total(v_after, "vllm:prefix_cache_queries_total", e)
        den -= total(v_idle, "vllm:prefix_cache_queries_total", e)
    for idle, after in ((s_idle, s_after), (d_idle, d_after)):
        num += total(after, "sglang:cached_tokens_total") - total(
            idle, "sglang:cached_tokens_total"
        )
        den += total(after, "sglang:prompt_tokens_total") - total(
            idle, "sglang:prompt_tokens_total"
        )
    assert agg["prefix_cache_hit_rate"]["pooled"] == pytest.approx(num / den, rel=1e-12)


def test_sglang_prefix_cache_hit_rate() -> None:
    res = observe_polls(
        [(0.0, {"s": body("single_idle.prom")}), (30.0, {"s": body("single_after.prom")})]
    )
    t = TRUTH["single_after.prom"]["counters"]
    cached = sum(s["value"] for s in t if s["name"] == "sglang:cached_tokens_total")
    prompt = sum(s["value"] for s in t if s["name"] == "sglang:prompt_tokens_total")
    t0 = TRUTH["single_idle.prom"]["counters"]
    cached -= sum(s["value"] for s in t0 if s["name"] == "sglang:cached_tokens_total")
    prompt -= sum(s["value"] for s in t0 if s["name"] == "sglang:prompt_tokens_total")
    assert prompt > 0 and cached > 0
    m = res.stats.engine("s.0")
    assert m["prefix_cache_hit_rate"] == pytest.approx(cached / prompt)
    assert m["num_preemptions_total"] == 1  # one retraction, counted as a preemption


def test_openmetrics_body_with_escaped_sample_names_parses_as_the_text_body() -> None:
    text = parse(body("single_after.prom"))["0"]
    om = parse(body("single_after.openmetrics.txt"))["0"]
    assert set(om) == set(text)
    assert np.array_equal(
        np.array([om[k] for k in text]), np.array([text[k] for k in text]), equal_nan=True
    )
    assert om.value("vllm:time_to_first_token_seconds_count") == 11


def test_pd_fleet_scopes_come_from_the_bodies() -> None:
    res = observe_polls(
        [
            (0.0, {"p": body("pd_prefill_after.prom"), "d": body("pd_decode_after.prom")}),
            (30.0, {"p": body("pd_prefill_after.prom"), "d": body("pd_decode_after.prom")}),
        ]
    )
    assert {"prefill", "decode"} <= set(res.stats.scopes)
    assert res.stats.scopes["prefill"].engines == 1 and res.stats.scopes["decode"].engines == 1


def test_dp_attention_ranks_dedupe_per_replica() -> None:
    # DP attention: tp ranks 0-1 serve replica 0, tp ranks 2-3 replica 1; every rank logs
    lines = ["# HELP sglang:num_running_reqs r", "# TYPE sglang:num_running_reqs gauge"]
    for tp, dp, v in ((0, 0, 3), (1, 0, 3), (2, 1, 5), (3, 1, 5)):
        lines.append(
            f'sglang:num_running_reqs{{dp_rank="{dp}",engine_type="decode",model_name="m",'
            f'moe_ep_rank="0",pp_rank="0",tp_rank="{tp}"}} {v}.0'
        )
    lines += ["# HELP sglang:prompt_tokens_total p", "# TYPE sglang:prompt_tokens_total counter"]
    lines.append('sglang:prompt_tokens_total{engine_type="decode",model_name="m"} 7.0')
    expo = parse("\n".join(lines) + "\n")
    assert expo["0"].value("vllm:num_requests_running") == 3
    assert expo["1"].value("vllm:num_requests_running") == 5
    assert expo.endpoint is not None
    assert expo.endpoint.value("vllm:prompt_tokens_total") == 7
    assert expo.engine_roles == {"0": "decode", "1": "decode"}


def test_sglang_inter_token_latency_never_shares_a_key_with_vllms() -> None:
    """SGLang's ITL ``_count`` counts every token of a streamed chunk, vLLM's one per step:
    in a mixed fleet they are two metrics, never pooled under one key."""

    from fleetscope.fleet.state import FleetState
    from fleetscope.sources.base import ScrapeResult

    data = DATA
    bodies = {
        "vl": (
            data / "fixtures/vllm-0.32.0-cpu/single_load.prom",
            data / "fixtures/vllm-0.32.0-cpu/single_after.prom",
        ),
        "sg": (data / "sglang-0.5.23/single_idle.prom", data / "sglang-0.5.23/single_after.prom"),
    }
    state = FleetState()
    parsers = {n: Parser() for n in bodies}
    for i in range(2):
        scrapes = [
            ScrapeResult(
                n,
                parsers[n].parse(paths[i].read_text(), time=10.0 * i, wall_time=1e9 + 10 * i),
                10.0 * i,
                1e9 + 10 * i,
            )
            for n, paths in bodies.items()
        ]
        poll = state.observe(scrapes)
    assert "sglang_inter_token_latency_seconds_count" in poll.stats.columns
    vl = poll.stats.engine("vl.0")
    sg = poll.stats.engine("sg.0")
    assert (
        "inter_token_latency_seconds_count" in vl and "inter_token_latency_seconds_count" not in sg
    )
    assert "sglang_inter_token_latency_seconds_count" in sg
