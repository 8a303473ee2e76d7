"""Sharded reduction: merged partial reductions are exactly the one-shot reduction.

Two halves:

* pure (no Ray): a poll's ``EngineInput`` rows, from simulated-fleet bodies and the real vLLM
  0.32 captures parsed with ``fleetscope.exposition.Parser``, are cut into random contiguous
  parts (empty ones included: a shard whose endpoints all failed).
  ``finish_reduce(merge_partials([partial_reduce(part) ...]))`` must give *bit-identical*
  per-engine rows and scope statistics (rates, quantiles, pooled ratios...) to
  ``reduce_poll(all)``, with prefill/decode roles, user groups, mixed bucket layouts (a server
  with another ``max_model_len``, an engine with other TTFT buckets), a bucket layout changed
  mid-run, restarts, lazy series and baseline-only newcomers;
* Ray (a real local cluster, never skipped): ``ShardedCollector`` with 2 and 4 shards against
  one ``Collector`` on the same simulated fleet, stepped only between polls (frozen states):
  identical key sets, identical values for every key that does not depend on a collector's own
  clock, rates = increase / that collector's own seconds; a shard's failing endpoint shows in
  the driver's ``scrape_failures`` and ``engines_reporting``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypedDict, cast

import numpy as np
import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.collector.sharded import ShardedCollector, shard_endpoints
from fleetscope.exposition import Parser
from fleetscope.fleet.state import FleetState
from fleetscope.identity import Role
from fleetscope.sources.base import ScrapeResult
from fleetscope.sources.http.source import Endpoint
from fleetscope.stats.reduce import (
    EngineInput,
    PollStats,
    finish_reduce,
    merge_partials,
    partial_reduce,
    reduce_poll,
)
from fleetscope_sim import FleetServer, SimFleet
from support.paths import VLLM_DIR
from support.ray_cluster import local_ray

WALL0 = 1_795_000_000.0
TTFT = "vllm:time_to_first_token_seconds"

# ----------------------------------------------------------------------------- pure half


def _bits(a: np.ndarray) -> np.ndarray:
    """Bit patterns of a float array (NaN == NaN, -0.0 != 0.0): exact comparison."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


def assert_identical(got: PollStats, want: PollStats) -> None:
    assert got.engine_ids == want.engine_ids
    assert got.columns == want.columns
    assert got.kinds == want.kinds
    assert list(got.roles) == list(want.roles)
    assert np.array_equal(got.is_engine, want.is_engine)
    assert np.array_equal(_bits(got.seconds), _bits(want.seconds))
    assert got.matrix.shape == want.matrix.shape
    assert np.array_equal(_bits(got.matrix), _bits(want.matrix)), "per-engine matrix differs"
    assert list(got.scopes) == list(want.scopes)
    for name, want_scope in want.scopes.items():
        got_scope = got.scopes[name]
        assert got_scope.engines == want_scope.engines, name
        assert list(got_scope.metrics) == list(want_scope.metrics), name
        for metric, stats in want_scope.metrics.items():
            g = got_scope.metrics[metric]
            assert list(g) == list(stats), (name, metric)
            for stat, v in stats.items():
                # bit-identical, not approximately equal
                assert np.float64(g[stat]).view(np.int64) == np.float64(v).view(np.int64), (
                    name,
                    metric,
                    stat,
                    g[stat],
                    v,
                )


def random_splits(n: int, rng: random.Random, max_parts: int = 6) -> list[tuple[int, int]]:
    """Contiguous [start, stop) parts covering range(n); empty parts allowed."""
    k = rng.randint(1, max_parts)
    cuts = sorted(rng.randint(0, n) for _ in range(k - 1))
    edges = [0, *cuts, n]
    return list(itertools.pairwise(edges))


def sharded_reduce(
    inputs: Sequence[EngineInput], splits: Sequence[tuple[int, int]], extra: Sequence[str] = ()
) -> PollStats:
    parts = [partial_reduce(inputs[a:b], extra_scopes=extra) for a, b in splits]
    return finish_reduce(merge_partials(parts))


# endpoint name -> (role, dp, max_model_len, groups)
SIM_LAYOUT: dict[str, tuple[Role | None, int, int, tuple[str, ...]]] = {
    "prefill0": ("prefill", 1, 512, ("model-a", "node0")),
    "prefill1": ("prefill", 2, 1024, ("model-a", "node1")),
    "decode0": ("decode", 2, 512, ("model-a", "node0")),
    "decode1": ("decode", 1, 1024, ("model-b",)),
    "server0": (None, 1, 512, ("model-b", "node1")),
    "decode2": ("decode", 3, 512, ()),
}


def _sim_fleet(seed: int) -> SimFleet:
    fleet = SimFleet(seed=seed, wall_start=WALL0)
    for name, (role, dp, max_len, _groups) in SIM_LAYOUT.items():
        fleet.add_endpoint(role=role, dp=dp, max_model_len=max_len, name=name)
    # one engine with its own TTFT buckets: pooled on the intersection of bounds
    fleet.endpoint("decode0").change_buckets(TTFT, [0.01, 0.05, 0.1, 0.5, 1.0, 5.0], engine=1)
    return fleet


class _Poller:
    """Parses bodies per endpoint (one Parser each) and folds them into a FleetState."""

    def __init__(self) -> None:
        self.parsers: dict[str, Parser] = {}
        self.state = FleetState()
        self.meta: dict[str, tuple[Role | None, tuple[str, ...]]] = {}

    def poll(self, bodies: dict[str, str | bytes], t: float) -> list[EngineInput]:
        scrapes = []
        for i, (name, body) in enumerate(bodies.items()):
            role, groups = self.meta[name]
            arrived = t + 0.0137 * i  # every endpoint has its own response time
            expo = self.parsers.setdefault(name, Parser()).parse(
                body, time=arrived, wall_time=WALL0 + arrived
            )
            scrapes.append(
                ScrapeResult(name, expo, arrived, WALL0 + arrived, role=role, groups=groups)
            )
        inputs, _deltas, _restarts = self.state.fold(scrapes)
        return inputs


def _fixture(name: str) -> str:
    return (VLLM_DIR / name).read_text(encoding="utf-8")


def poll_sequence(seed: int) -> list[list[EngineInput]]:
    """Several polls of a heterogeneous fleet: simulated endpoints plus the real captures."""
    fleet = _sim_fleet(seed)
    p = _Poller()
    for name, (role, _dp, _len, groups) in SIM_LAYOUT.items():
        p.meta[name] = (role, groups)
    p.meta["real-dp2"] = ("decode", ("model-real",))
    p.meta["real-single"] = ("prefill", ("model-real", "node0"))
    p.meta["late0"] = ("decode", ("model-b",))

    def bodies(real_dp2: str, real_single: str) -> dict[str, str | bytes]:
        out: dict[str, str | bytes] = dict(fleet.render_all())
        out["real-dp2"] = _fixture(real_dp2)
        out["real-single"] = _fixture(real_single)
        return out

    polls: list[list[EngineInput]] = []
    fleet.step(1.5)
    polls.append(p.poll(bodies("dp2_idle.prom", "single_idle.prom"), 10.0))  # baselines
    fleet.step(2.0)
    polls.append(p.poll(bodies("dp2_load.prom", "single_load.prom"), 12.0))
    # mid-run: a restart, a lazily created series, a bucket layout change, a newcomer
    fleet.endpoint("decode2").restart()
    fleet.endpoint("prefill1").add_lazy_series("vllm:request_success_total", "timeout")
    fleet.endpoint("decode1").change_buckets(TTFT, [0.001, 0.01, 0.1, 1.0, 10.0])
    fleet.add_endpoint(role="decode", dp=2, name="late0")
    fleet.step(2.5)
    polls.append(p.poll(bodies("dp2_load.prom", "single_after.prom"), 14.5))
    fleet.step(3.0)
    polls.append(p.poll(bodies("dp2_load.prom", "single_after.prom"), 17.5))
    return polls


@pytest.fixture(scope="module")
def polls() -> list[list[EngineInput]]:
    return poll_sequence(seed=7)


def test_inputs_cover_what_the_merge_must_handle(polls: list[list[EngineInput]]) -> None:
    """The data really has roles, groups, mixed bucket layouts, restarts and baselines."""
    last = polls[-1]
    roles = {i.role for i in last}
    assert {"prefill", "decode", None} <= roles
    assert {g for i in last for g in i.groups} >= {"model-a", "model-b", "model-real", "node0"}
    assert any(not i.is_engine for i in last)  # endpoint rows (API-server counters)
    assert all(i.delta.baseline_only for i in polls[0])
    newcomer = [i.delta.baseline_only for i in polls[2] if i.engine_id.startswith("late0")]
    assert newcomer and all(newcomer)  # baseline-only rows next to rows with deltas
    assert any(i.delta.restarted for i in polls[2])
    assert any(i.delta.series_new for p in polls[2:] for i in p)  # lazy `timeout` series
    bounds = {
        h.bounds for i in last for h in i.delta.layout.histograms if h.name == TTFT and h.bounds
    }
    assert len(bounds) >= 3, bounds  # three TTFT layouts pooled together
    stats = reduce_poll(last)
    for scope in ("agg", "decode", "model-b"):
        assert "p99" in stats.scopes[scope].metrics["time_to_first_token_seconds"], scope
    assert "pooled" in stats.scopes["agg"].metrics["prefix_cache_hit_rate"]
    assert stats.scopes["agg"].metrics["generation_tokens_total"]["delta"] > 0


@pytest.mark.parametrize("poll_index", [0, 1, 2, 3])
def test_merged_partials_equal_one_reduction(
    polls: list[list[EngineInput]], poll_index: int
) -> None:
    inputs = polls[poll_index]
    want = reduce_poll(inputs)
    rng = random.Random(1000 + poll_index)
    n = len(inputs)
    cases = [[(0, n)], [(0, 0), (0, n)], [(i, i + 1) for i in range(n)]]  # one row per part
    cases += [random_splits(n, rng) for _ in range(2 if poll_index == 0 else 5)]
    for splits in cases:
        assert_identical(sharded_reduce(inputs, splits), want)


def test_extra_scopes_and_groups_in_one_part_only(polls: list[list[EngineInput]]) -> None:
    """A group whose engines are all in one part, and a declared scope no engine is in."""
    inputs = polls[-1]
    extra = ("empty-scope", "model-real")
    want = reduce_poll(inputs, extra_scopes=extra)
    assert want.scopes["empty-scope"].engines == 0
    rng = random.Random(5)
    for _ in range(3):
        splits = random_splits(len(inputs), rng)
        assert_identical(sharded_reduce(inputs, splits, extra), want)


def test_another_seed() -> None:
    for seed in (2,):
        inputs = poll_sequence(seed)[-1]
        want = reduce_poll(inputs)
        rng = random.Random(seed)
        for _ in range(3):
            assert_identical(sharded_reduce(inputs, random_splits(len(inputs), rng)), want)


def test_shard_endpoints_is_contiguous_and_balanced() -> None:
    eps = [Endpoint(f"http://x{i}") for i in range(10)]
    for shards in (1, 2, 3, 4, 10, 20):
        parts = shard_endpoints(eps, shards)
        assert [e for p in parts for e in p] == eps
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


# ----------------------------------------------------------------------------- Ray half

# endpoint roles of the served fleet, in order (names: prefill0.., decode0.., server0)
RAY_ROLES: list[Role | None] = ["prefill", "prefill", "decode", "decode", "decode", None, "decode"]
RAY_DP = [1, 2, 2, 1, 2, 1, 2]
FAILING = "decode3"  # in the last shard with 2 and with 4 shards


def clock_dependent(key: str) -> bool:
    """Keys whose value depends on when the collector's own responses arrived."""
    return (
        ":rate" in key  # rates and their spread (`.../x:rate/cv`)
        or "scrape_latency_seconds" in key
        or "/collector/" in key  # the collector's own poll time and load
        # judged over the collector's seconds (stall time, rate ratios)
        or key.endswith(("/generation_stalled", "/engine_outlier"))
    )


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray("fsshard-", log_to_driver=False) as ctx:
        yield ctx


def _served_fleet() -> SimFleet:
    fleet = SimFleet(seed=11)
    for role, dp in zip(RAY_ROLES, RAY_DP, strict=True):
        fleet.add_endpoint(role=role, dp=dp)
    return fleet


def interval_clock_dependent(keys: Mapping[str, float | str]) -> Callable[[str], bool]:
    """For window and summary keys: also active seconds, coverage (the run labels' is covered
    engine-seconds over active seconds; windows' is checked apart), gauges' time-weighted
    stats (weighted by each collector's own seconds; their peaks are not) and the engine-time
    breakdown (each collector's own intervals)."""
    gauges = {k[: -len("/peak")] for k in keys if k.endswith("/peak")}

    def dependent(key: str) -> bool:
        return (
            clock_dependent(key)
            or key.endswith(("/active_seconds", "/coverage"))
            or (key.rsplit("/", 1)[0] in gauges and not key.endswith("/peak"))
            # engine time: each collector's own scrape intervals, classified (rules §3.13)
            or "/engine_time/" in key
            or key.endswith(("/bottleneck", "/bottleneck_role"))
        )

    return dependent


def _compare(
    got: Mapping[str, float | str],
    want: Mapping[str, float | str],
    label: str,
    skip: Callable[[str], bool] = clock_dependent,
) -> int:
    # the collectors' own keys (`/collector/`: poll time, a sharded one's shard restarts and
    # live shards) are each collector's
    ours, theirs = ({k for k in d if "/collector/" not in k} for d in (got, want))
    assert ours == theirs, (label, sorted(ours ^ theirs)[:20])
    compared = 0
    for k, v in want.items():
        if skip(k):
            continue
        # exact: the same scrapes, the same arithmetic, whatever the sharding
        # (summaries hold a few str values: equal, they never reach the NaN check)
        assert got[k] == v or (math.isnan(cast(float, got[k])) and math.isnan(cast(float, v))), (
            label,
            k,
            got[k],
            v,
        )
        compared += 1
    return compared


def _check_rates(stats: PollStats, prev: PollStats, span: float, label: str) -> None:
    """rate = increase / seconds, with this collector's own per-engine seconds."""
    checked = engines = 0
    pairs = [
        ("generation_tokens_total:rate", "generation_tokens_total"),
        ("prompt_tokens_total:rate", "prompt_tokens_total"),
        ("time_to_first_token_seconds:rate", "time_to_first_token_seconds_count"),
    ]
    for i, eid in enumerate(stats.engine_ids):
        if not stats.is_engine[i] or eid not in prev.engine_ids:
            continue
        engines += 1
        sec = float(stats.seconds[i])
        # the interval is this collector's: its two responses, inside the driver's span
        assert 0 < sec <= span, (label, eid, sec, span)
        j = prev.engine_ids.index(eid)
        for rate_col, total_col in pairs:
            rate = stats.matrix[i, stats.columns.index(rate_col)]
            increase = (
                stats.matrix[i, stats.columns.index(total_col)]
                - prev.matrix[j, prev.columns.index(total_col)]
            )
            assert rate * sec == pytest.approx(increase, rel=1e-9, abs=1e-9), (label, eid, rate_col)
            checked += 1
    assert engines >= sum(RAY_DP) - RAY_DP[-1] and checked == 3 * engines, (label, checked)


async def _poll_all(
    collectors: dict[str, Collector],
) -> tuple[dict[str, FleetView], float, float]:
    t0 = time.monotonic()
    views: dict[str, FleetView] = {}
    for name, c in collectors.items():  # one after another: all see the same frozen bodies
        views[name] = await c.poll()
    return views, t0, time.monotonic()


def test_sharded_collector_matches_one_collector(ray_cluster: Any) -> None:
    fleet = _served_fleet()
    fleet.step(1.0)
    with FleetServer(fleet) as server:
        # named, but no roles: every collector (each shard, for the sharded ones) discovers
        # them from /get_metrics_worker_info, and the role scopes must still agree
        eps = [Endpoint(url, ep.name) for url, ep in zip(server.urls, fleet.endpoints, strict=True)]
        shards_of = {2: shard_endpoints(eps, 2), 4: shard_endpoints(eps, 4)}
        for parts in shards_of.values():  # the failing endpoint is not in the first shard
            assert FAILING not in {e.name for e in parts[0]}
        asyncio.run(_run_collectors(fleet, eps))


async def _run_collectors(fleet: SimFleet, eps: list[Endpoint]) -> None:
    collectors: dict[str, Collector] = {
        # a scrape deadline no loaded machine reaches: the test compares, it does not time out
        "one": Collector(eps, interval=5.0, timeout=30.0),
        "shards2": ShardedCollector(eps, shards=2, interval=5.0, timeout=30.0),
        "shards4": ShardedCollector(eps, shards=4, interval=5.0, timeout=30.0),
    }
    assert [e.name for e in collectors["one"].endpoints][-2:] == ["server0", FAILING]
    assert all(e.role is None for e in eps)
    gen = "inference/agg/generation_tokens_total/delta"
    truth0 = fleet.truth_total("vllm:generation_tokens_total")
    totals = dict.fromkeys(collectors, 0.0)
    try:
        await _discover_roles(fleet, collectors)
        history: list[tuple[dict[str, FleetView], float]] = []
        for step in range(3):  # baselines; FAILING answers HTTP 500; it is back
            if step:
                fleet.step(2.0)
            if step == 1:
                fleet.endpoint(FAILING).set_http_error(500)
            if step == 2:
                fleet.endpoint(FAILING).clear_faults()
            views, t0, t1 = await _poll_all(collectors)
            history.append((views, t0))
            keys = {name: v.keys for name, v in views.items()}
            _check_shards_agree(step, views, keys)
            for name, v in views.items():
                totals[name] += v.keys.get(gen, 0.0)
            if step == 0:
                assert keys["one"].get(gen, 0.0) == 0.0  # the fleet has not moved since warm-up
                # a window from here to the end: its boundary polls see the same bodies
                for c in collectors.values():
                    await c.window("train").astart()
                truth_start = fleet.truth_total("vllm:generation_tokens_total")
                continue
            prev_views, prev_t0 = history[-2]
            for name, v in views.items():
                _check_rates(v.result.stats, prev_views[name].result.stats, t1 - prev_t0, name)
            _check_failure_keys(keys, failed=step == 1, n_endpoints=len(eps))
        # the failed poll's increase is counted at the next success: run totals are exact
        want = fleet.truth_total("vllm:generation_tokens_total") - truth0
        for name, total in totals.items():
            assert total == want, (name, total, want)
        in_window = await _check_window_summary_and_state(fleet, collectors, truth_start)
    finally:
        for c in collectors.values():
            await c.stop()
    # the run summary, gathered from the shards at stop
    summary = {name: c.summary() for name, c in collectors.items()}
    run_total = "inference_summary/combined/agg/generation_tokens_total/delta"
    assert summary["one"][run_total] == want
    assert summary["one"]["inference_summary/train/agg/generation_tokens_total/delta"] == in_window
    for name in ("shards2", "shards4"):
        skip = interval_clock_dependent(summary["one"])
        n = _compare(summary[name], summary["one"], f"summary {name}", skip)
        assert n > 1000, n


async def _discover_roles(fleet: SimFleet, collectors: dict[str, Collector]) -> None:
    """Every collector discovers the roles (side requests beside the first polls, retried
    with backoff if a loaded machine made one miss its deadline) before they are compared."""
    want_roles = {ep.name: ep.role for ep in fleet.endpoints}
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and any(
        {e.name: e.role for e in c.endpoints} != want_roles for c in collectors.values()
    ):
        await _poll_all(collectors)
        await asyncio.sleep(0.5)


def _check_shards_agree(
    step: int, views: dict[str, FleetView], keys: dict[str, Mapping[str, float]]
) -> None:
    """The sharded collectors' keys and typed views are one collector's."""
    for name in ("shards2", "shards4"):
        n = _compare(keys[name], keys["one"], f"step {step} {name}")
        assert n > 500, n
        # the typed view too (admission control reads it)
        want_pre = {e: x.preemptions_since_last_poll for e, x in views["one"].engines.items()}
        got_pre = {e: x.preemptions_since_last_poll for e, x in views[name].engines.items()}
        assert got_pre == want_pre, (step, name)
        lens = {e: x.max_model_len for e, x in views[name].engines.items()}
        assert lens == {e: x.max_model_len for e, x in views["one"].engines.items()}
        assert views[name].engines["prefill0.0"].max_model_len == 512  # /v1/models
        if step:
            assert sum(v is not None for v in want_pre.values()) >= 8


def _check_failure_keys(
    keys: dict[str, Mapping[str, float]], failed: bool, n_endpoints: int
) -> None:
    """Every collector counts the failed scrape (or none) the same way."""
    dp_failed = RAY_DP[-1]
    for name, k in keys.items():
        assert k["inference/agg/scrape_failures"] == float(failed), name
        assert k["inference/decode/scrape_failures"] == float(failed), name
        assert k["inference/agg/scrape_failures_total"] == 1.0, name
        assert k["inference/health/scrape_failed"] == float(failed), name
        assert k["inference/agg/endpoints_reporting"] == n_endpoints - failed, name
        assert k["inference/agg/engines_reporting"] == sum(RAY_DP) - failed * dp_failed
        assert k["inference/decode/engines_reporting"] == (
            sum(d for d, r in zip(RAY_DP, RAY_ROLES, strict=True) if r == "decode")
            - failed * dp_failed
        ), name
        assert (f"inference/{FAILING}.0/num_requests_running" in k) == (not failed)
        # roles reach the driver: a prefill engine's ~0 generation never pins decode
        assert k["inference/health/engine_outlier"] == 0.0, name


async def _check_window_summary_and_state(
    fleet: SimFleet, collectors: dict[str, Collector], truth_start: float
) -> float:
    """The window, the mid-run summary and a checkpoint of the sharded collectors are one
    collector's (the shards' per-engine sums plus the driver's polls). Returns the window's
    true generated tokens."""
    # windows: the shards' per-engine sums plus the driver's polls give one collector's keys
    window = {name: await c.window("train").astop() for name, c in collectors.items()}
    in_window = fleet.truth_total("vllm:generation_tokens_total") - truth_start
    for name, k in window.items():
        assert k["inference/train/agg/generation_tokens_total/delta"] == in_window, name
        assert k["inference/train/polls"] == 3.0 and k["inference/train/failed_scrapes"] == 1
        assert k["inference/train/coverage"] == 1.0, name  # the failure cost nothing
    for name in ("shards2", "shards4"):
        skip = interval_clock_dependent(window["one"])
        n = _compare(window[name], window["one"], f"window {name}", skip)
        assert n > 500, n
    # the run summary mid-run: the shards are asked for their sums (async and sync)
    mid = {name: await c.asummary() for name, c in collectors.items()}
    assert mid["one"]["inference_summary/train/agg/generation_tokens_total/delta"] == in_window
    skip = interval_clock_dependent(mid["one"])
    for name in ("shards2", "shards4"):
        assert _compare(mid[name], mid["one"], f"mid-run summary {name}", skip) > 1000
        assert collectors[name].summary() == mid[name]  # nothing polled in between
    # checkpoints: a sharded collector's state (shards' sums merged in) resumes anywhere
    for name, c in collectors.items():
        resumed = Collector([], interval=5.0)
        resumed.load_state_dict(c.state_dict())
        assert resumed.summary() == mid[name], name
        await resumed.stop()
    return in_window


def test_sharded_collector_follows_fleet_changes(ray_cluster: Any) -> None:
    """add_endpoints / remove_endpoints on a sharded collector: an added endpoint goes to the
    emptiest shard (empty shards included), a removed one is dropped by its shard; a window
    across both changes has one collector's keys, the fleet's true total and coverage 1."""
    fleet = SimFleet(seed=5)
    for _ in range(3):
        fleet.add_endpoint(dp=2)
    fleet.step(3.0)
    with FleetServer(fleet) as server:
        urls = {ep.name: server.url(ep.name) for ep in fleet.endpoints}
        asyncio.run(_follow_changes(fleet, urls))


async def _follow_changes(fleet: SimFleet, urls: dict[str, str]) -> None:
    start = [Endpoint(urls["server0"], "server0"), Endpoint(urls["server1"], "server1")]
    collectors: dict[str, Collector] = {
        "one": Collector(start, interval=5.0, fetch_model_info=False),
        "shards4": ShardedCollector(start, shards=4, interval=5.0),  # two start empty
    }

    def gen(name: str) -> float:
        return fleet.endpoint(name).truth_total("vllm:generation_tokens_total")

    try:
        await _poll_all(collectors)
        for c in collectors.values():
            await c.window("train").astart()
        start_truth = {n: gen(n) for n in ("server0", "server1")}
        fleet.step(2.0)
        await _poll_all(collectors)
        for c in collectors.values():
            assert [e.name for e in c.add_endpoints(Endpoint(urls["server2"], "server2"))] == [
                "server2"
            ]
        fleet.step(2.0)
        views, _, _ = await _poll_all(collectors)  # server2's baseline
        first2 = gen("server2")
        for v in views.values():
            assert {e.endpoint for e in v.engines.values()} == {"server0", "server1", "server2"}
        fleet.step(2.0)
        await _poll_all(collectors)
        for c in collectors.values():
            assert c.remove_endpoints("server0") == ["server0"]
        last0 = gen("server0")
        fleet.step(2.0)
        views, _, _ = await _poll_all(collectors)
        for name, v in views.items():
            assert {e.endpoint for e in v.engines.values()} == {"server1", "server2"}, name
            assert v.endpoints_expected == 2
        window = {name: await c.window("train").astop() for name, c in collectors.items()}
    finally:
        for c in collectors.values():
            await c.stop()
    want = (
        (last0 - start_truth["server0"])
        + (gen("server1") - start_truth["server1"])
        + (gen("server2") - first2)
    )
    skip = interval_clock_dependent(window["one"])
    assert _compare(window["shards4"], window["one"], "fleet changes", skip) > 200
    for name, k in window.items():
        assert k["inference/train/agg/generation_tokens_total/delta"] == want, name
        assert k["inference/train/coverage"] == pytest.approx(1.0, abs=1e-12), name


# ----------------------------------------------------------------------------- RL figures

RL_DP = {"server0": 1, "server1": 2, "server2": 1, "server3": 2}


def rl_figure(key: str) -> bool:
    """The RL keys of a poll row, a window or the summary."""
    return (
        "/rl/" in key
        or key.endswith(("/weight_version_lag", "/engines_paused", "/engines_asleep"))
        or "_engine_seconds" in key
        or key.endswith(("/paused_share", "/sleeping_share"))
    )


def rl_clock_dependent(key: str) -> bool:
    """Seconds measured with each collector's own clock (checked apart, against its deltas)."""
    return "_engine_seconds" in key or key.endswith(("_share", "sync/seconds", "seconds_total"))


def test_sharded_collector_reports_the_same_rl_figures(ray_cluster: Any) -> None:
    """Versions, skew, stale tokens, weight syncs, paused / asleep engines: the probes run in
    the driver and the shards' scrapes feed them, so a sharded collector reports exactly one
    collector's RL figures; its paused / asleep engine-seconds follow its own deltas."""
    fleet = SimFleet(seed=13)
    for dp in RL_DP.values():
        fleet.add_endpoint(dp=dp)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        eps = [Endpoint(server.url(n), n) for n in RL_DP]
        asyncio.run(_run_rl(fleet, eps))


class _RlOptions(TypedDict):
    interval: float
    rl_probes: bool
    fetch_model_info: bool


async def _run_rl(fleet: SimFleet, eps: list[Endpoint]) -> None:
    opts: _RlOptions = {"interval": 3600.0, "rl_probes": True, "fetch_model_info": False}
    collectors: dict[str, Collector] = {
        "one": Collector(eps, **opts),
        "shards2": ShardedCollector(eps, shards=2, **opts),
    }
    ep = {n: fleet.endpoint(n) for n in RL_DP}
    try:
        await _poll_all(collectors)  # baselines
        for c in collectors.values():
            c.set_policy_version("v0")
            c.set_policy_version("v1")
        for n in ("server0", "server1"):
            ep[n].update_weight_version("v1")
        ep["server2"].update_weight_version("v0")  # stale; server3 serves "default": unknown
        ep["server1"].pause()
        ep["server2"].sleep(1)
        fleet.step(1.0)
        rows = [await _poll_all(collectors)]
        for c in collectors.values():
            await c.window("train").astart()
        fleet.step(1.0)
        rows.append(await _poll_all(collectors))
        syncs = {}
        for name, c in collectors.items():
            syncs[name] = c.weight_sync("v2")
            await syncs[name].__aenter__()
        fleet.step(1.0)
        # on a DP=2 server (multiprocess: no _created): the fleet is stepped by hand, so a
        # single-process server's simulated _created may lag the real clock of the polls
        ep["server1"].simulate_weight_update("v2")
        ep["server1"].resume()
        fleet.step(1.0)
        for name in collectors:
            await syncs[name].__aexit__(None, None, None)
        fleet.step(1.0)
        rows.append(await _poll_all(collectors))
        window = {name: await c.window("train").astop() for name, c in collectors.items()}
    finally:
        for c in collectors.values():
            await c.stop()
    summary = {name: c.summary() for name, c in collectors.items()}
    checked = 0
    for i, (views, _, _) in enumerate(rows):
        one, sharded = views["one"].keys, views["shards2"].keys
        got = {k for k in sharded if rl_figure(k)}
        assert got == {k for k in one if rl_figure(k)}
        for k in got:
            if not rl_clock_dependent(k):
                assert sharded[k] == one[k], k
                checked += 1
        for name, v in views.items() if i == 0 else ():  # after a boundary: held seconds too
            # engine-seconds: each collector's own intervals
            d = v.result.deltas
            paused = sum(x.seconds for e, x in d.items() if e.is_engine and e.endpoint == "server1")
            asleep = sum(x.seconds for e, x in d.items() if e.is_engine and e.endpoint == "server2")
            vk = v.keys
            if (
                "inference/server1/paused_engine_seconds" in vk
                and vk["inference/server1/engines_paused"]
            ):
                assert vk["inference/server1/paused_engine_seconds"] == pytest.approx(paused), name
            assert vk["inference/server2/sleeping_engine_seconds"] == pytest.approx(asleep), name
    first = rows[0][0]["shards2"].keys
    assert (
        first["inference/rl/engines_stale"] == 1
        and first["inference/rl/engines_unknown_version"] == 2
    )
    assert first["inference/agg/engines_paused"] == 3 and first["inference/agg/engines_asleep"] == 1
    upd = "inference/rl/sync/engine_update_count{operation=update}"
    assert syncs["one"].keys[upd] == syncs["shards2"].keys.get(upd) == 1, syncs["shards2"].keys
    for a, b in (
        (syncs["shards2"].keys, syncs["one"].keys),
        (window["shards2"], window["one"]),
        (summary["shards2"], summary["one"]),
    ):
        ks = {k for k in b if rl_figure(k)}
        assert ks and ks == {k for k in a if rl_figure(k)}
        for k in ks:
            if not rl_clock_dependent(k):
                assert a[k] == b[k], k
                checked += 1
    assert checked > 60, checked
