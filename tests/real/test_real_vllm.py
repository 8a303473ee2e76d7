"""fleetscope against two real vLLM 0.32 servers (CPU): one engine, and data-parallel 2.

Run by ``make test-real`` (see ``conftest.py`` for the scenario). Every number fleetscope reports
for the ``load`` window is checked against an independent source: the load generator's own
counts, counters read straight from the scraped bodies, and PromQL on a real Prometheus that
scraped the same frozen states.
"""

from __future__ import annotations

import math

import pytest

from fleetscope.sinks.terminal import window_lines
from real import bodies as B
from real.scenario import GROUP, KIND, WINDOW, RealRun

ENGINES = {"server0.0", "server1.0", "server1.1"}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
REL = 1e-9


def wkey(scope: str, metric: str, stat: str) -> str:
    return f"inference/{WINDOW}/{scope}/{metric}/{stat}"


def scopes(run: RealRun) -> dict[str, list[str]]:
    """fleetscope scope -> the endpoints it covers."""
    return {"agg": list(run.urls), **{GROUP[e]: [e] for e in run.urls}}


def body_delta(run: RealRun, endpoints: list[str], name: str, **match: str) -> float:
    return sum(
        B.total(run.body(e, "after"), name, **match) - B.total(run.body(e, "idle"), name, **match)
        for e in endpoints
    )


def load_of(run: RealRun, endpoints: list[str], key: str) -> int:
    return sum(run.load["servers"][run.urls[e]][key] for e in endpoints)


# ----------------------------------------------------------------------------- the fleet


def test_load_generator_ran_clean(real_run: RealRun) -> None:
    total = real_run.load["total"]
    assert total["failed"] == 0, total["errors"][:5]
    assert total["sent"] == total["ok"] > 0
    for server in real_run.load["servers"].values():
        assert set(server["by_kind"]) == {
            "completion",
            "chat",
            "completion_stream",
            "chat_stream",
        }


def test_engines_found(real_run: RealRun) -> None:
    for view in real_run.views:
        assert set(view.engines) == ENGINES
        assert view.endpoints_reporting == view.endpoints_expected == 2
        assert all(e.reporting for e in view.engines.values())


def test_first_poll_of_idle_dp_server(real_run: RealRun) -> None:
    """Multiprocess mode: before its first request the DP server exposes no gauge samples.
    fleetscope's first poll must take it as it is: scraped fine, gauges missing (not 0)."""
    dp_idle = real_run.body("server1", "idle")
    assert B.engines(dp_idle) == {"0", "1"}
    assert not B.present(dp_idle, "vllm:num_requests_running"), "vLLM now writes idle gauges"
    view = real_run.first_view
    assert view is not None
    assert all(sc.ok for sc in view.result.scrapes), [sc.error for sc in view.result.scrapes]
    for eid in ("server1.0", "server1.1"):
        assert view.engines[eid].running is None
        assert view.engines[eid].kv_usage is None
    assert view.engines["server0.0"].running == 0.0
    assert view.keys["inference/agg/engines_reporting"] == 3.0
    # under load and after it, the DP server's gauges exist and are read
    last = real_run.views[-1]
    assert last.engines["server1.0"].running == 0.0
    assert last.engines["server1.1"].kv_usage is not None


def test_no_fleetscope_warnings(real_run: RealRun) -> None:
    assert real_run.warnings == [], "polls (running, waiting, tok/s):\n" + real_run.table()
    assert real_run.window_keys[f"inference/{WINDOW}/failed_scrapes"] == 0.0
    assert real_run.window_keys[f"inference/{WINDOW}/engine_restarts"] == 0.0
    # every poll after the start boundary, the stop boundary included
    assert real_run.window_keys[f"inference/{WINDOW}/polls"] == len(real_run.views) - 2


def test_window_coverage_is_complete(real_run: RealRun) -> None:
    assert real_run.window_keys[f"inference/{WINDOW}/coverage"] == pytest.approx(1.0, abs=1e-9)


# ----------------------------------------------------------------------------- exact totals


@pytest.mark.parametrize("scope", ["agg", "single", "dp2"])
def test_window_token_totals_equal_the_load(real_run: RealRun, scope: str) -> None:
    eps = scopes(real_run)[scope]
    keys = real_run.window_keys
    assert keys[wkey(scope, "prompt_tokens_total", "delta")] == load_of(
        real_run, eps, "prompt_tokens"
    )
    assert keys[wkey(scope, "generation_tokens_total", "delta")] == load_of(
        real_run, eps, "completion_tokens"
    )


@pytest.mark.parametrize("scope", ["agg", "single", "dp2"])
def test_window_request_counts_equal_the_load(real_run: RealRun, scope: str) -> None:
    eps = scopes(real_run)[scope]
    keys = real_run.window_keys
    sent = load_of(real_run, eps, "sent")
    assert keys[wkey(scope, "request_success_total", "delta")] == sent
    # the finished_reason breakdown stays separate and adds up
    by_reason = {
        k: v
        for k, v in keys.items()
        if k.startswith(f"inference/{WINDOW}/{scope}/request_success_total{{")
        and k.endswith("/delta")
    }
    assert by_reason and sum(by_reason.values()) == sent
    # the load generator saw the same finish reasons
    reasons: dict[str, int] = {}
    for e in eps:
        for r, n in real_run.load["servers"][real_run.urls[e]]["finish_reasons"].items():
            reasons[r] = reasons.get(r, 0) + n
    for r, n in reasons.items():
        key = wkey(scope, f"request_success_total{{finished_reason={r}}}", "delta")
        assert keys.get(key, 0.0) == n, (key, by_reason)


@pytest.mark.parametrize("scope", ["agg", "single", "dp2"])
def test_every_counter_equals_the_bodies(real_run: RealRun, scope: str) -> None:
    """Every vllm: counter family's window delta equals Δ of the bodies (idle -> after)."""
    eps = scopes(real_run)[scope]
    keys = real_run.window_keys
    checked = 0
    for fam in B.counter_families(real_run.body(eps[0], "after")):
        want = body_delta(real_run, eps, fam + "_total")
        metric = fam.removeprefix("vllm:") + "_total"
        got = keys.get(wkey(scope, metric, "delta"))
        assert got is not None, f"{metric}: no window delta"
        assert got == pytest.approx(want, rel=REL, abs=1e-9), metric
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize("scope", ["agg", "single", "dp2"])
def test_prefix_cache_hit_rate_equals_the_servers_counters(real_run: RealRun, scope: str) -> None:
    eps = scopes(real_run)[scope]
    hits = body_delta(real_run, eps, "vllm:prefix_cache_hits_total")
    queries = body_delta(real_run, eps, "vllm:prefix_cache_queries_total")
    assert hits > 0, "the repeated prompts should hit the prefix cache"
    got = real_run.window_keys[wkey(scope, "prefix_cache_hit_rate", "pooled")]
    assert got == pytest.approx(hits / queries, rel=REL)
    # vLLM's own breakdown says the same: cached prompt tokens
    cached = body_delta(
        real_run, eps, "vllm:prompt_tokens_by_source_total", source="local_cache_hit"
    )
    assert cached == hits


def test_window_histogram_counts_equal_the_requests(real_run: RealRun) -> None:
    keys = real_run.window_keys
    sent = real_run.load["total"]["sent"]
    for metric in (
        "e2e_request_latency_seconds",
        "time_to_first_token_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
    ):
        # a histogram's observation count over the window is its `delta`
        assert keys[wkey("agg", metric, "delta")] == sent, metric
    # the pooled means are Δsum / Δcount: the load's tokens per request
    for metric, tokens in (
        ("request_prompt_tokens", "prompt_tokens"),
        ("request_generation_tokens", "completion_tokens"),
    ):
        want = real_run.load["total"][tokens] / sent
        assert keys[wkey("agg", metric + ":mean", "pooled")] == pytest.approx(want, rel=REL)


# ----------------------------------------------------------------------------- PromQL oracle


def _prom_name(run: RealRun, name: str) -> str:
    """The name Prometheus stored: ``vllm:x`` (text format) or ``vllm_x`` (OpenMetrics)."""
    prom = run.prom
    for candidate in (name, name.replace(":", "_")):
        if prom.query(f'count({{__name__="{candidate}"}} {prom.at(run.t2)})'):
            return candidate
    raise AssertionError(f"Prometheus stored neither {name} nor its underscored form")


def _promql_quantile(run: RealRun, family: str, q: float, endpoints: list[str]) -> float:
    name = _prom_name(run, family + "_bucket")
    inst = "|".join(run.targets[e].replace(".", "\\\\.") for e in endpoints)
    sel = f'{{__name__="{name}",instance=~"{inst}"}}'
    after = f"sum by (le) ({sel} {run.prom.at(run.t2)})"
    before = f"sum by (le) ({sel} {run.prom.at(run.t1)})"
    expr = f"histogram_quantile({q}, {after} - ({before} or 0 * {after}))"
    res = run.prom.query(expr)
    return res[0]["value"] if res else math.nan


def test_prometheus_scraped_the_frozen_states(real_run: RealRun) -> None:
    """The PromQL oracle sees the same counters as the bodies at T1 (idle) and T2 (after)."""
    prom = real_run.prom
    name = _prom_name(real_run, "vllm:request_success_total")
    got = prom.query_value(
        f'sum({{__name__="{name}"}} {prom.at(real_run.t2)}) '
        f'- sum({{__name__="{name}"}} {prom.at(real_run.t1)})'
    )
    assert got == real_run.load["total"]["sent"]


@pytest.mark.parametrize("scope", ["agg", "single", "dp2"])
def test_window_quantiles_equal_promql(real_run: RealRun, scope: str) -> None:
    eps = scopes(real_run)[scope]
    keys = real_run.window_keys
    compared = 0
    for fam in B.histogram_families(real_run.body(eps[0], "after")):
        metric = fam.removeprefix("vllm:")
        observed = body_delta(real_run, eps, fam + "_count")
        for stat, q in QUANTILES.items():
            want = _promql_quantile(real_run, fam, q, eps)
            got = keys.get(wkey(scope, metric, stat))
            if observed == 0:
                assert math.isnan(want) and got is None, (metric, stat, want, got)
                continue
            assert got is not None, f"{metric}/{stat}: fleetscope has none, PromQL says {want}"
            assert got == pytest.approx(want, rel=REL, abs=1e-12), (metric, stat)
            compared += 1
    assert compared >= 3 * 8, compared


@pytest.mark.parametrize("scope", ["agg", "single", "dp2"])
def test_window_quantiles_equal_the_bodies(real_run: RealRun, scope: str) -> None:
    """The same quantiles from the bodies' bucket deltas (independent of Prometheus)."""
    from support.promql import promql_bucket_quantile

    eps = scopes(real_run)[scope]
    keys = real_run.window_keys
    for fam in B.histogram_families(real_run.body(eps[0], "after")):
        merged: dict[float, float] = {}
        for e in eps:
            for le, c in B.bucket_delta(real_run.body(e, "after"), real_run.body(e, "idle"), fam):
                merged[le] = merged.get(le, 0.0) + c
        for stat, q in QUANTILES.items():
            want = promql_bucket_quantile(q, sorted(merged.items()))
            got = keys.get(wkey(scope, fam.removeprefix("vllm:"), stat))
            if math.isnan(want):
                assert got is None
            else:
                assert got == pytest.approx(want, rel=REL, abs=1e-12), (fam, stat)


# ----------------------------------------------------------------------------- the bodies


def test_bodies_saved(real_run: RealRun) -> None:
    for e in real_run.urls:
        for phase in ("idle", "load", "after"):
            p = real_run.out_dir / f"{KIND[e]}_{phase}.prom"
            assert p.is_file() and p.stat().st_size > 1000, p
    assert (real_run.out_dir / "meta.json").is_file()
    # the "load" body was taken while the server worked: requests running, or its counts
    # strictly between the idle and the final body (a sample between two engine steps can
    # show 0 running on a tiny CPU model)
    gen = "vllm:generation_tokens_total"
    for e in ("server0", "server1"):
        load = real_run.body(e, "load")
        idle, after = real_run.body(e, "idle"), real_run.body(e, "after")
        mid = B.total(idle, gen) < B.total(load, gen) < B.total(after, gen)
        assert B.total(load, "vllm:num_requests_running") > 0 or mid, e


def test_vllm_ignores_accept_and_writes_colon_names(real_run: RealRun) -> None:
    """vLLM's /metrics route (prometheus-fastapi-instrumentator's) always writes the classic
    text format, whatever ``Accept`` asks for, under prometheus_client's CONTENT_TYPE_LATEST
    (``text/plain; version=1.0.0``). So Prometheus, which asks for OpenMetrics, still gets and
    stores ``vllm:`` names — unlike a plain prometheus_client app (see tests/support/prom.py)."""
    for e in real_run.urls:
        for phase in ("after", "after_openmetrics"):
            ctype = real_run.content_types[(e, phase)]
            assert ctype.startswith("text/plain"), ctype
        text = real_run.body(e, "after")
        om = real_run.body(e, "after_openmetrics")
        assert [ln for ln in om.splitlines() if ln.startswith("vllm:")] == [
            ln for ln in text.splitlines() if ln.startswith("vllm:")
        ]
    assert _prom_name(real_run, "vllm:request_success_total") == "vllm:request_success_total"


def test_engine_time_of_the_load_window(real_run: RealRun) -> None:
    """docs/rules.md §3.13 on real engines: the load window's shares sum to 1 in every scope
    and for every engine, and the engines served the load (busy or saturated time): its
    requests are short (~0.2 s) and a loaded machine polls seldom, so many start and finish
    between two scrapes that find nothing running, and count by their own running seconds
    (server0's: the DP server shows no gauge before its first step, so its first interval has
    no known start and is judged at its end)."""
    w = real_run.window_keys
    phases = ("idle", "busy", "saturated", "paused", "syncing")
    print("\nengine time, window load:", *window_lines(w))
    for scope in [*scopes(real_run), *ENGINES]:
        b = f"inference/{WINDOW}/{scope}/engine_time"
        assert math.fsum(w[f"{b}/{p}_share"] for p in phases) == pytest.approx(1.0, abs=1e-12)
        assert w[f"{b}/paused_share"] == 0.0 and w[f"{b}/syncing_share"] == 0.0
        if scope in ("agg", "server0.0"):
            assert w[f"{b}/busy_share"] + w[f"{b}/saturated_share"] > 0, scope
    b = f"inference/{WINDOW}/agg/engine_time"
    tokens = w[wkey("agg", "generation_tokens_total", "delta")]
    busy = w[f"{b}/engine_seconds"] * (w[f"{b}/busy_share"] + w[f"{b}/saturated_share"])
    assert w[f"{b}/tokens_per_busy_engine_second"] == pytest.approx(tokens / busy, rel=REL)
