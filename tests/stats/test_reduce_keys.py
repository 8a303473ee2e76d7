"""Scope reductions (docs/rules.md §3.4-3.6, 4) and key schemas / the key budget (docs/rules.md §5).

Expected values are computed from the bodies' text; quantiles with the independent PromQL
reference in support.promql.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from fleetscope.exposition import Parser
from fleetscope.exposition.snapshot import EngineSnapshot
from fleetscope.fleet.state import FleetState, PollResult
from fleetscope.identity import Role
from fleetscope.keys import DEFAULT_KEY_BUDGET, KeyOptions, poll_keys, tail_engines
from fleetscope.sources.base import ScrapeResult
from fleetscope.stats.deltas import engine_delta
from fleetscope.stats.reduce import EngineInput, reduce_poll
from support.bodies import bucket_values, sample_value, set_values
from support.paths import fixture_text
from support.promql import promql_bucket_quantile

WALL = 1_795_970_000.0
IDLE = fixture_text("single_idle.prom")
LOAD = fixture_text("single_load.prom")
AFTER = fixture_text("single_after.prom")
DP_IDLE = fixture_text("dp2_idle.prom")
DP_LOAD = fixture_text("dp2_load.prom")
TTFT = "vllm:time_to_first_token_seconds"


def observe(
    polls: Sequence[tuple[float, dict[str, str]]],
    *,
    roles: Mapping[str, Role] | None = None,
    key_options: KeyOptions | None = None,
) -> PollResult:
    """Run FleetState over [(t, {endpoint: body})]; return the last PollResult."""
    state = FleetState(key_options=key_options)
    parsers: dict[str, Parser] = {}
    res: PollResult | None = None
    for t, bodies in polls:
        scrapes: list[ScrapeResult] = []
        for name, body in bodies.items():
            p = parsers.setdefault(name, Parser())
            expo = p.parse(body, time=t, wall_time=WALL + t)
            scrapes.append(ScrapeResult(name, expo, t, WALL + t, role=(roles or {}).get(name)))
        res = state.observe(scrapes)
    assert res is not None
    return res


def eng_pattern(family: str, engine: str) -> str:
    return rf'^{family}\{{engine="{engine}"'


def text_delta(prev: str, cur: str, family: str, engine: str = "0") -> float:
    return sample_value(cur, eng_pattern(family, engine)) - sample_value(
        prev, eng_pattern(family, engine)
    )


def bucket_deltas(prev: str, cur: str, family: str, engine: str = "0") -> list[tuple[float, float]]:
    a = bucket_values(prev, family, f'engine="{engine}"')
    b = bucket_values(cur, family, f'engine="{engine}"')
    assert [x for x, _ in a] == [x for x, _ in b]
    return [(le, cb - ca) for (le, ca), (_, cb) in zip(a, b, strict=True)]


# --------------------------------------------------------------------------- per engine, scopes


def test_dp2_per_engine_metrics_and_scope_stats_from_the_text() -> None:
    res = observe([(0.0, {"server0": DP_IDLE}), (30.0, {"server0": DP_LOAD})])
    st = res.stats
    gen = {e: text_delta(DP_IDLE, DP_LOAD, "vllm:generation_tokens_total", e) for e in "01"}
    hits = {e: text_delta(DP_IDLE, DP_LOAD, "vllm:prefix_cache_hits_total", e) for e in "01"}
    queries = {e: text_delta(DP_IDLE, DP_LOAD, "vllm:prefix_cache_queries_total", e) for e in "01"}
    running = {e: sample_value(DP_LOAD, eng_pattern("vllm:num_requests_running", e)) for e in "01"}
    for e in "01":
        m = st.engine(f"server0.{e}")
        assert m["generation_tokens_total:rate"] == pytest.approx(gen[e] / 30)
        assert m["prefix_cache_hit_rate"] == pytest.approx(hits[e] / queries[e])
        assert m["num_requests_running"] == running[e]
    agg = st.scopes["agg"].metrics
    rates = [gen[e] / 30 for e in "01"]
    g = agg["generation_tokens_total:rate"]
    assert g["min"] == pytest.approx(min(rates)) and g["max"] == pytest.approx(max(rates))
    assert g["sum"] == pytest.approx(sum(rates)) and g["mean"] == pytest.approx(sum(rates) / 2)
    assert g["median"] == pytest.approx(statistics.median(rates))
    assert agg["generation_tokens_total"]["delta"] == sum(gen.values())
    hr = agg["prefix_cache_hit_rate"]
    assert hr["pooled"] == pytest.approx(sum(hits.values()) / sum(queries.values()))
    assert hr["mean"] == pytest.approx(statistics.mean(hits[e] / queries[e] for e in "01"))
    r = agg["num_requests_running"]
    assert r["sum"] == sum(running.values())
    assert r["cv"] == pytest.approx(
        float(np.std(list(running.values())) / np.mean(list(running.values())))
    )
    assert st.scopes["agg"].engines == 2


def test_histogram_rate_mean_and_pooled_quantiles_equal_promql_on_bucket_deltas() -> None:
    res = observe([(0.0, {"server0": DP_IDLE}), (30.0, {"server0": DP_LOAD})])
    agg = res.stats.scopes["agg"].metrics[TTFT.removeprefix("vllm:")]
    pooled: dict[float, float] = {}
    for e in "01":
        for le, d in bucket_deltas(DP_IDLE, DP_LOAD, TTFT, e):
            pooled[le] = pooled.get(le, 0.0) + d
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert agg[label] == promql_bucket_quantile(q, list(pooled.items()))
    counts = [text_delta(DP_IDLE, DP_LOAD, TTFT + "_count", e) for e in "01"]
    sums = [text_delta(DP_IDLE, DP_LOAD, TTFT + "_sum", e) for e in "01"]
    mean = res.stats.scopes["agg"].metrics["time_to_first_token_seconds:mean"]
    assert mean["pooled"] == pytest.approx(sum(sums) / sum(counts))
    rate = res.stats.scopes["agg"].metrics["time_to_first_token_seconds:rate"]
    assert rate["sum"] == pytest.approx(sum(counts) / 30)


def _with_1000_bucket(body: str, extra: float) -> str:
    """The body of a server with max_model_len 1024: one more prompt-length bucket."""
    out = []
    for line in body.split("\n"):
        out.append(line)
        if line.startswith("vllm:request_prompt_tokens_bucket{") and 'le="500.0"' in line:
            head, _, v = line.rpartition(" ")
            out.append(f"{head.replace('500.0', '1000.0')} {float(v) + extra!r}")
    return "\n".join(out)


def test_mixed_bucket_layouts_in_one_scope_pool_on_shared_bounds_with_every_engine() -> None:
    s1_prev, s1_cur = _with_1000_bucket(LOAD, 0.0), _with_1000_bucket(AFTER, 0.0)
    res = observe(
        [
            (0.0, {"server0": LOAD, "server1": s1_prev}),
            (10.0, {"server0": AFTER, "server1": s1_cur}),
        ]
    )
    agg = res.stats.scopes["agg"].metrics["request_prompt_tokens"]
    d0 = dict(bucket_deltas(LOAD, AFTER, "vllm:request_prompt_tokens"))
    d1 = dict(bucket_deltas(s1_prev, s1_cur, "vllm:request_prompt_tokens"))
    assert 1000.0 in d1 and 1000.0 not in d0
    shared = [(le, d0[le] + d1[le]) for le in d0]  # every engine, the shared bounds
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert agg[label] == promql_bucket_quantile(q, shared)
    # both engines' observations are in the pool (none dropped): `delta` of the count
    n = text_delta(LOAD, AFTER, "vllm:request_prompt_tokens_count")
    assert res.stats.scopes["agg"].metrics["request_prompt_tokens"]["delta"] == 2 * n


def test_rank_in_inf_bucket_gives_the_highest_finite_bound() -> None:
    # every new TTFT observation above 2560 s: only _count, +Inf and _sum grow
    cur = set_values(LOAD, r"^vllm:time_to_first_token_seconds_(count|sum)\{", lambda v: v + 5)
    cur = set_values(
        cur, r'^vllm:time_to_first_token_seconds_bucket\{.*le="\+Inf"', lambda v: v + 5
    )
    res = observe([(0.0, {"server0": LOAD}), (10.0, {"server0": cur})])
    m = res.stats.scopes["agg"].metrics["time_to_first_token_seconds"]
    assert m["p50"] == m["p90"] == m["p99"] == 2560.0


def test_no_observations_means_no_quantile_key() -> None:
    res = observe([(0.0, {"server0": LOAD}), (5.0, {"server0": LOAD})])
    m = res.stats.scopes["agg"].metrics.get("time_to_first_token_seconds", {})
    assert not {"p50", "p90", "p99"} & set(m)
    assert not [k for k in res.keys if "time_to_first_token_seconds/p" in k]
    # the rate is a real 0, the mean of nothing is absent
    assert res.keys["inference/agg/time_to_first_token_seconds:rate/sum"] == 0.0
    assert "inference/agg/time_to_first_token_seconds:mean/pooled" not in res.keys
    assert "inference/server0.0/time_to_first_token_seconds:mean" not in res.keys


def test_nan_gauge_is_missing_in_keys_never_zero() -> None:
    cur = set_values(AFTER, r"^vllm:kv_cache_usage_perc\{", "NaN")  # type: ignore[arg-type]  # set_values writes a str value verbatim; its signature omits str
    res = observe([(0.0, {"server0": LOAD}), (10.0, {"server0": cur})])
    assert not [k for k in res.keys if "kv_cache_usage_perc" in k]
    assert "kv_cache_usage_perc" not in res.stats.engine("server0.0")


def test_kv_capacity_derived_from_cache_config_info() -> None:
    res = observe([(0.0, {"server0": LOAD}), (10.0, {"server0": AFTER})])
    line = next(ln for ln in AFTER.split("\n") if ln.startswith("vllm:cache_config_info{"))
    assert 'kv_cache_size_tokens="524288"' in line
    assert res.keys["inference/server0.0/kv_cache_capacity_tokens"] == 524288.0
    # without kv_cache_size_tokens: num_gpu_blocks x block_size
    old = AFTER.replace('kv_cache_size_tokens="524288",', "")
    res = observe([(0.0, {"server0": old}), (10.0, {"server0": old})])
    assert res.keys["inference/server0.0/kv_cache_capacity_tokens"] == 4096 * 128


def test_derived_ratios_from_the_real_interval() -> None:
    res = observe([(0.0, {"server0": LOAD}), (10.0, {"server0": AFTER})])
    m = res.stats.engine("server0.0")
    fin = {
        r: sample_value(AFTER, rf'^vllm:request_success_total\{{.*"{r}"')
        - sample_value(LOAD, rf'^vllm:request_success_total\{{.*"{r}"')
        for r in ("stop", "length", "abort", "error", "repetition")
    }
    assert m["length_finished_share"] == pytest.approx(fin["length"] / sum(fin.values()))
    assert m["preemptions_per_million_output_tokens"] == 0.0
    assert m["prefix_cache_hit_rate"] == pytest.approx((10368 - 1024) / (15472 - 2550))


# --------------------------------------------------------------------------- roles


def _role_fleet() -> tuple[list[tuple[float, dict[str, str]]], dict[str, Role]]:
    """2 prefill + 3 decode endpoints over one interval. Prefill engines generate ~1 token
    per request by design; decode1 is the sick decode engine."""
    polls_prev: dict[str, str] = {}
    polls_cur: dict[str, str] = {}
    roles: dict[str, Role] = {}
    gen = r'^vllm:generation_tokens_total\{engine="0"'
    for i in range(2):
        n = f"prefill{i}"
        polls_prev[n] = LOAD
        polls_cur[n] = set_values(AFTER, gen, 25.0 + 3)  # 3 tokens in 10 s
        roles[n] = "prefill"
    for i, tokens in enumerate((2000.0, 300.0, 1800.0)):
        n = f"decode{i}"
        polls_prev[n] = LOAD
        polls_cur[n] = set_values(AFTER, gen, 25.0 + tokens)
        roles[n] = "decode"
    return [(0.0, polls_prev), (10.0, polls_cur)], roles


def test_role_tails_decode_generation_min_comes_from_decode_engines() -> None:
    polls, roles = _role_fleet()
    res = observe(polls, roles=roles)
    sc = res.stats.scopes
    agg = sc["agg"].metrics["generation_tokens_total:rate"]
    assert agg["min"] == pytest.approx(30.0)  # decode1, not a prefill engine's 0.3
    assert agg["max"] == pytest.approx(200.0)
    assert agg["sum"] == pytest.approx((3 + 3 + 2000 + 300 + 1800) / 10)  # every engine
    assert sc["decode"].metrics["generation_tokens_total:rate"]["min"] == pytest.approx(30.0)
    assert sc["prefill"].metrics["generation_tokens_total:rate"]["min"] == pytest.approx(0.3)
    assert sc["decode"].engines == 3 and sc["prefill"].engines == 2
    assert res.keys["inference/decode/generation_tokens_total:rate/min"] == pytest.approx(30.0)
    assert res.keys["inference/agg/generation_tokens_total:rate/min"] == pytest.approx(30.0)
    # prompt tokens are not decode-only: their tails cover every engine
    prompt = sc["agg"].metrics["prompt_tokens_total:rate"]
    assert prompt["min"] == prompt["max"] == pytest.approx((15472 - 2550) / 10)


# --------------------------------------------------------------------------- keys


def test_prime_rl_key_schema() -> None:
    res = observe([(0.0, {"server0": LOAD}), (10.0, {"server0": AFTER})])
    k = res.keys
    assert k["inference/server0.0/generation_tokens_total:rate"] == pytest.approx(197.3)
    assert k["inference/agg/generation_tokens_total:rate/sum"] == pytest.approx(197.3)
    assert k["inference/agg/prefix_cache_hit_rate/pooled"] == pytest.approx(9344 / 12922)
    assert k["inference/agg/engines_reporting"] == 1.0
    assert not [key for key in k if "vllm:" in key]  # the prefix is stripped
    assert all(key.startswith("inference/") for key in k)
    assert all(math.isfinite(v) for v in k.values())


def test_skyrl_key_schema() -> None:
    polls, roles = _role_fleet()
    res = observe(polls, roles=roles, key_options=KeyOptions(schema="skyrl"))
    k = res.keys
    assert k["vllm/generation_throughput_tok_s"] == pytest.approx((6 + 4100) / 10)
    assert k["vllm/decode/generation_throughput_tok_s"] == pytest.approx(4100 / 10)
    assert k["vllm/prefill/generation_throughput_tok_s"] == pytest.approx(0.6)
    assert k["vllm/prefix_cache_hit_rate"] == pytest.approx(9344 / 12922)
    assert not [key for key in k if key.startswith("inference/")]


def _big_fleet(
    n_endpoints: int = 512, *, roles: bool = True, seed: int = 0
) -> tuple[list[EngineInput], dict[str, str]]:
    """1,024 engines (512 dp2 endpoints) from the real dp2 layout with perturbed values."""
    rng = np.random.default_rng(seed)
    p = Parser()
    base = p.parse(DP_LOAD, time=0.0, wall_time=WALL)
    lay = base["0"].layout
    data = base["0"].data
    cum = np.concatenate([lay.cumulative, [h.sum for h in lay.histograms]]).astype(np.intp)
    gen = lay.index["vllm:generation_tokens_total"]
    running = lay.index["vllm:num_requests_running"]
    inputs: list[tuple[str, Role | None, EngineSnapshot, EngineSnapshot]] = []
    want: dict[str, str] = {}
    for i in range(n_endpoints):
        role: Role | None = ("prefill" if i % 2 == 0 else "decode") if roles else None
        for e in ("0", "1"):
            eid = f"{role or 'server'}{i}.{e}"
            prev = EngineSnapshot(eid, lay, data.copy(), 0.0, WALL, None)
            cur_data = data.copy()
            cur_data[cum] *= 1.0 + rng.uniform(0.5, 1.5)  # every cumulative value grows
            cur_data[running] = float(rng.integers(1, 50))
            if role == "prefill":
                cur_data[gen] = data[gen] + 1.0
            inputs.append(
                (eid, role, prev, EngineSnapshot(eid, lay, cur_data, 5.0, WALL + 5, None))
            )
    # the sick decode engine and the busiest engine
    sick, busy = "decode7.1", "prefill10.0"
    out: list[EngineInput] = []
    for eid, role, prev, cur in inputs:
        if eid == sick:
            cur.data[gen] = prev.data[gen] + 2.0  # >= the prefill engines' 1 token
        if eid == busy:
            cur.data[running] = 500.0
        out.append(EngineInput(eid, engine_delta(prev, cur), role))
    want["sick"], want["busy"] = sick, busy
    return out, want


def test_key_budget_with_1024_engines_keeps_tail_engines_by_name() -> None:
    inputs, want = _big_fleet()
    assert sum(1 for i in inputs if i.is_engine) == 1024
    stats = reduce_poll(inputs)
    keys = poll_keys(stats, KeyOptions())
    assert len(keys) <= DEFAULT_KEY_BUDGET
    per_engine = {k.split("/")[1] for k in keys if k.split("/")[1] not in stats.scopes}
    assert 0 < len(per_engine) < 64  # tails only, by name
    assert f"inference/{want['busy']}/num_requests_running" in keys
    # the sick decode engine is the decode tail; a prefill engine's 1 token is not
    assert f"inference/{want['sick']}/generation_tokens_total:rate" in keys
    assert want["sick"] in tail_engines(stats)
    dec = stats.scopes["decode"].metrics["generation_tokens_total:rate"]
    assert dec["min"] == pytest.approx(2.0 / 5)
    assert stats.scopes["agg"].metrics["generation_tokens_total:rate"]["min"] == dec["min"]
    # a smaller budget: scope keys first, then as many tail engines as fit
    small = poll_keys(stats, KeyOptions(key_budget=2000))
    n_scope = sum(1 for k in small if k.split("/")[1] in stats.scopes)
    assert len(small) - n_scope <= max(0, 2000 - n_scope)


def test_small_fleet_gets_every_engines_keys() -> None:
    res = observe([(0.0, {"server0": DP_IDLE}), (30.0, {"server0": DP_LOAD})])
    for e in ("server0.0", "server0.1"):
        assert f"inference/{e}/generation_tokens_total:rate" in res.keys
        assert f"inference/{e}/time_to_first_token_seconds:mean" in res.keys
