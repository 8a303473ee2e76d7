"""Windows and the run summary (docs/rules.md §3.8) against a simulated fleet over real HTTP.

The fleet is stepped by hand between polls ("frozen steps"): two scrapes with no step between
them see the same bodies, so the fleet's own ground truth at each poll is known exactly and
every window total can be compared with it, to the token.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetscope.collector.core import Collector
from fleetscope.sinks.jsonl import JsonlSink, read_jsonl
from fleetscope.sources.http.source import Endpoint
from fleetscope.stats.windows import WindowError
from fleetscope_sim import FleetServer, SimFleet
from support.simclock import ahead_fleet

# metric as fleetscope names it -> (simulator family, label values)
COUNTERS: dict[str, tuple[str, ...]] = {
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "request_success_total": ("vllm:request_success_total",),
    "request_success_total{finished_reason=stop}": ("vllm:request_success_total", "stop"),
    "request_success_total{finished_reason=length}": ("vllm:request_success_total", "length"),
    "request_success_total{finished_reason=abort}": ("vllm:request_success_total", "abort"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total",),
}


def polls(c: Collector) -> int:
    """The step of the collector's last poll (-1 before the first): public in both modes."""
    return c.last.step if c.last is not None else -1


pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

SCOPES = ("agg", "prefill", "decode")


@dataclass
class Rig:
    fleet: SimFleet
    server: FleetServer
    endpoints: list[Endpoint]

    def truth(self, scope: str = "agg", endpoint: str | None = None) -> dict[str, float]:
        """The fleet's own totals now (never reset), per fleetscope metric name."""
        if endpoint is not None:
            ep = self.fleet.endpoint(endpoint)
            return {m: ep.truth_total(*spec) for m, spec in COUNTERS.items()}
        role = "any" if scope == "agg" else scope
        return {m: self.fleet.truth_total(*spec, role=role) for m, spec in COUNTERS.items()}

    def truth_all(self) -> dict[str, dict[str, float]]:
        return {scope: self.truth(scope) for scope in SCOPES}

    def collector(self, **kw: Any) -> Collector:
        kw.setdefault("interval", 3600)  # polls only when the test asks
        # no test here is about timeouts: a healthy endpoint must answer however loaded the
        # machine is (a slow answer only moves the scrape times the assertions read)
        kw.setdefault("timeout", 30.0)
        kw.setdefault("fetch_model_info", False)
        kw.setdefault("verify", False)  # plain HTTP: skip loading the CA bundle
        return Collector(self.endpoints, **kw)

    def expected_coverage(
        self, start: dict[str, float], end: dict[str, float], stop: dict[str, float]
    ) -> float:
        """Engine-seconds each engine was covered (from its own scrape at the start boundary
        to its own last successful scrape) / engine-seconds it should have been covered (to its
        own scrape at the stop boundary, or that boundary's time if it did not answer)."""
        n = {ep.name: len(ep.engines) for ep in self.fleet.endpoints}
        covered = sum(n[e] * (end[e] - start[e]) for e in n)
        want = sum(n[e] * (stop[e] - start[e]) for e in n)
        return min(1.0, covered / want)


def scrape_times(c: Collector) -> dict[str, float]:
    """When each endpoint's response of the collector's latest poll arrived (successes only)."""
    assert c.last is not None
    return {sc.endpoint: sc.time for sc in c.last.result.scrapes if sc.ok}


@asynccontextmanager
async def rig(seed: int = 3) -> AsyncIterator[Rig]:
    """Four API servers: plain (single-process exposition), prefill (dp=2, multiprocess),
    two decode servers (dp=2 multiprocess and dp=1 single), engines already busy. The fleet's
    clock stays ahead of ours: a server a test restarts after a scrape is dated after it,
    however slow the polls (or the collector's child process start) were."""
    fleet = ahead_fleet(seed=seed)
    fleet.add_endpoint(role=None, dp=1)
    fleet.add_endpoint(role="prefill", dp=2)
    fleet.add_endpoint(role="decode", dp=2)
    fleet.add_endpoint(role="decode", dp=1)
    fleet.step(4.0)
    server = FleetServer(fleet).start()
    try:
        eps = [
            Endpoint(url, role=ep.role)
            for url, ep in zip(server.urls, fleet.endpoints, strict=True)
        ]
        yield Rig(fleet, server, eps)
    finally:
        server.stop()


def diff(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a[k] - b[k] for k in a}


def window_totals(keys: Mapping[str, Any], base: str, scope: str = "agg") -> dict[str, float]:
    """A window's (or a run label's) totals per metric: of its keys or of a run summary."""
    return {m: keys.get(f"{base}/{scope}/{m}/delta", math.nan) for m in COUNTERS}


async def step_and_poll(
    r: Rig, c: Collector, n: int = 1, dt: float = 1.0, pause: float = 0.02
) -> None:
    for _ in range(n):
        r.fleet.step(dt)
        await asyncio.sleep(pause)  # a little real time: active seconds are not ~0
        await c.poll()


# --------------------------------------------------------------------------- exact totals


async def test_window_totals_equal_ground_truth_per_scope() -> None:
    async with rig() as r:
        c = r.collector()
        await c.poll()  # baselines
        r.fleet.step(1.0)  # before the window: must not be in it
        train = c.window("train")
        await train.astart()
        t0, s0 = r.truth_all(), scrape_times(c)
        await step_and_poll(r, c, n=3)
        r.fleet.step(1.0)  # between the last poll and the boundary: in the window
        keys = await train.astop()
        t1, s1 = r.truth_all(), scrape_times(c)
        await c.stop()
    assert keys["inference/train/agg/generation_tokens_total/delta"] > 1000  # a real load
    for scope in SCOPES:
        assert window_totals(keys, "inference/train", scope) == diff(t1[scope], t0[scope]), scope
    assert keys["inference/train/agg/engines"] == 6
    assert keys["inference/train/polls"] == 4  # three polls inside + the stop boundary
    assert keys["inference/train/failed_scrapes"] == 0
    assert keys["inference/train/engine_restarts"] == 0
    # rates divide by the window's active seconds
    secs = keys["inference/train/active_seconds"]
    # every engine covered from its own start-boundary scrape to its own stop-boundary scrape
    cov = keys["inference/train/coverage"]
    assert cov == pytest.approx(r.expected_coverage(s0, s1, s1), rel=1e-9)
    assert cov == 1.0  # nothing failed: every engine covered boundary to boundary
    assert 0.05 < secs < 5
    for m in ("generation_tokens_total", "prompt_tokens_total"):
        for scope in SCOPES:
            rate = keys[f"inference/train/{scope}/{m}:rate/sum"]
            assert rate == pytest.approx(keys[f"inference/train/{scope}/{m}/delta"] / secs)


FAULTS = ["http_error", "restart_engine", "restart_single", "restart_mp", "restart_unseen"]


@pytest.mark.parametrize("fault", FAULTS)
async def test_fault_inside_window_keeps_totals_exact(fault: str) -> None:
    async with rig() as r:
        c = r.collector()
        await c.poll()
        train = c.window("train")
        await train.astart()
        t0 = r.truth_all()
        await step_and_poll(r, c)
        if fault == "http_error":  # decode0 answers 500 to exactly one poll
            r.fleet.step(1.0)
            r.fleet.endpoint("decode0").set_http_error(500)
            view = await c.poll()
            r.fleet.endpoint("decode0").clear_faults()
            assert view.endpoints_reporting == 3
            assert view.keys["inference/agg/scrape_failures"] == 1
        elif fault == "restart_engine":  # one engine core of a multiprocess server
            r.fleet.endpoint("prefill0").restart_engine(1)
        elif fault == "restart_single":  # whole server, single-process exposition
            r.fleet.endpoint("decode1").restart()
        elif fault == "restart_mp":  # multiprocess exposition: no _created, no process start
            r.fleet.endpoint("decode0").restart()
        else:  # decode1 works for a while after our last scrape, then restarts: that work
            seen = r.truth(endpoint="decode1")  # was never exported to anyone
            r.fleet.step(0.5)
            unseen = diff(r.truth(endpoint="decode1"), seen)
            r.fleet.endpoint("decode1").restart()
        await step_and_poll(r, c, n=2)
        r.fleet.step(1.0)
        keys = await train.astop()
        t1 = r.truth_all()
        await c.stop()
    for scope in SCOPES:
        want = diff(t1[scope], t0[scope])
        if fault == "restart_unseen" and scope != "prefill":
            assert unseen["generation_tokens_total"] > 0
            want = diff(want, unseen)  # all of it but what no scrape could ever see
        assert window_totals(keys, "inference/train", scope) == want, scope
    # a failed scrape in the middle costs no coverage: the next success spans the gap exactly;
    # a reset restarts its series from 0 and voids nothing, but what the old process counted
    # after its last scrape was never observed: coverage says so (docs/bad-data.md §7)
    restarts = keys["inference/train/engine_restarts"]
    if fault == "http_error":
        assert keys["inference/train/coverage"] == 1.0
        assert keys["inference/train/restarts_unseen_tail"] == 0
        assert keys["inference/train/failed_scrapes"] == 1
        assert restarts == 0
    else:
        assert keys["inference/train/coverage"] < 1.0
        assert keys["inference/train/restarts_unseen_tail"] >= restarts
        assert keys["inference/train/failed_scrapes"] == 0
        # engines of the restarted server (and the server's own series for a whole restart)
        # engines only, as `engine_restarts_total` counts them (not the server's own row)
        assert restarts == (2 if fault == "restart_mp" else 1)
        assert c.last is not None
        assert restarts == c.last.keys["inference/agg/engine_restarts_total"]


# unseen_work=True: the server's http children come back one by one after the restart; their
# summed `_created` once faked a second reset (fixed in exposition.py, 9692acd)
@pytest.mark.inline_only  # reads in-process internals
@pytest.mark.parametrize("unseen_work", [False, True])
async def test_api_server_series_exact_across_restart(unseen_work: bool) -> None:
    """The server's own series (http_*, lazily created after a restart, so absent for a
    while) keep their window totals: exact but for what no scrape could see."""
    async with rig() as r:
        c = r.collector()
        await c.poll()
        ep = r.fleet.endpoint("decode1")

        def requests() -> float:
            return ep.truth.counter("http_requests_total")

        train = c.window("train")
        await train.astart()
        t0 = requests()
        await step_and_poll(r, c)
        seen = requests()
        if unseen_work:
            r.fleet.step(0.5)
        unseen = requests() - seen
        ep.restart()
        await step_and_poll(r, c, n=4)
        await train.astop()
        t1 = requests()
        await c.stop()
    row = c.windows.run["train"].engines["decode1"]  # the server's row in the window's sums
    slots = [s.slot for s in row.layout.counters if s.name == "http_requests"]
    assert slots and t1 - t0 - unseen > 0
    assert row.delta[slots].sum() == t1 - t0 - unseen
    assert row.restarts == 1


async def test_failed_scrape_at_window_end_lowers_coverage_and_moves_delta_to_idle() -> None:
    """The stop boundary's scrape of decode0 fails: the window is exact for what it covers,
    reports the coverage it lost, and decode0's last increase lands in the next label."""
    async with rig() as r:
        c = r.collector()
        await c.poll()
        c0 = r.truth_all()
        train = c.window("train")
        started = time.monotonic()  # before the start boundary's scrapes
        await train.astart()
        t0, s0 = r.truth_all(), scrape_times(c)
        await step_and_poll(r, c, n=2, pause=0.05)
        d_seen, s_seen = r.truth(endpoint="decode0"), scrape_times(c)
        # a long last interval, 3x what decode0 has been covered so far (however slow the
        # polls were): what decode0 loses is visible, at least 3/4 of its window
        await asyncio.sleep(max(0.4, 3 * (time.monotonic() - started)))
        r.fleet.step(1.0)
        r.fleet.endpoint("decode0").set_http_error(503)
        keys = await train.astop()
        t1, s1 = r.truth_all(), scrape_times(c)
        assert c.last is not None
        stop_time = c.last.result.time  # the stop boundary poll's time
        d_end = r.truth(endpoint="decode0")
        r.fleet.endpoint("decode0").clear_faults()
        await step_and_poll(r, c)  # idle: decode0 recovers, over the longer interval
        c1 = r.truth_all()
        await c.stop()
        summary = c.summary()
    lost = diff(d_end, d_seen)
    assert lost["generation_tokens_total"] > 0
    for scope in ("agg", "decode"):
        want = {m: t1[scope][m] - t0[scope][m] - lost[m] for m in COUNTERS}
        assert window_totals(keys, "inference/train", scope) == want, scope
    assert window_totals(keys, "inference/train", "prefill") == diff(t1["prefill"], t0["prefill"])
    assert keys["inference/train/failed_scrapes"] == 1
    # decode0's 2 engines (of 6) are covered only up to their last successful scrape
    assert "decode0" not in s1
    stop = {**s1, "decode0": stop_time}  # it did not answer: the boundary poll's time
    want_coverage = r.expected_coverage(s0, {**s1, "decode0": s_seen["decode0"]}, stop)
    assert keys["inference/train/coverage"] == pytest.approx(want_coverage, rel=1e-9)
    # decode0 (2 of 6 engines) covered for at most 1/4 of its window: 4/6 + 2/6 * 1/4
    assert keys["inference/train/coverage"] <= 0.75 + 1e-9
    # nothing is lost from the run: idle has the rest, combined is exact
    for scope in SCOPES:
        s = "inference_summary"
        combined = window_totals(summary, f"{s}/combined", scope)
        assert combined == diff(c1[scope], c0[scope]), scope
        parts = [window_totals(summary, f"{s}/{lab}", scope) for lab in ("train", "idle")]
        assert {m: parts[0][m] + parts[1][m] for m in COUNTERS} == combined, scope


# --------------------------------------------------------------------------- pause / resume, run


async def test_pause_resume_idle_and_combined(tmp_path: Path) -> None:
    path = tmp_path / "polls.jsonl"
    async with rig() as r:
        c = r.collector(sinks=[JsonlSink(path)])
        await c.poll()
        start = r.truth_all()
        await step_and_poll(r, c)  # idle before any window
        train = c.window("train")
        await train.astart()
        t_start = r.truth_all()
        await step_and_poll(r, c, n=2)
        r.fleet.step(1.0)
        await train.apause()
        t_pause = r.truth_all()
        await step_and_poll(r, c, n=2, pause=0.15)  # paused: idle, and no active seconds
        r.fleet.step(1.0)
        await train.aresume()
        t_resume = r.truth_all()
        await step_and_poll(r, c)
        train_keys = await train.astop()
        t_stop = r.truth_all()
        await step_and_poll(r, c)  # idle between windows
        async with c.window("eval") as ev:
            e0 = r.truth_all()
            await step_and_poll(r, c, n=2)
            r.fleet.step(1.0)
        eval_keys = ev.keys
        e1 = r.truth_all()
        await step_and_poll(r, c)  # idle after
        end = r.truth_all()
        await c.stop()  # default status: success
        summary: dict[str, Any] = c.summary()  # float values, and the run status (str)

    for scope in SCOPES:
        want_train = {
            m: (t_pause[scope][m] - t_start[scope][m]) + (t_stop[scope][m] - t_resume[scope][m])
            for m in COUNTERS
        }
        assert window_totals(train_keys, "inference/train", scope) == want_train, scope
        assert window_totals(eval_keys, "inference/eval", scope) == diff(e1[scope], e0[scope])
        s = "inference_summary"
        combined = window_totals(summary, f"{s}/combined", scope)
        assert combined == diff(end[scope], start[scope]), scope
        parts = [window_totals(summary, f"{s}/{lab}", scope) for lab in ("train", "eval", "idle")]
        assert {m: sum(p[m] for p in parts) for m in COUNTERS} == combined, scope
        assert window_totals(summary, f"{s}/train", scope) == want_train
    # idle got real work: before, during the pause, between and after the windows
    assert summary["inference_summary/idle/agg/generation_tokens_total/delta"] > 0

    # active seconds exclude the pause (two polls with 0.15 s real sleeps each)
    active = train_keys["inference/train/active_seconds"]
    assert active == summary["inference_summary/train/active_seconds"]
    assert summary["inference_summary/combined/active_seconds"] > active + 0.3
    rate = train_keys["inference/train/agg/generation_tokens_total:rate/sum"]
    assert rate == pytest.approx(
        train_keys["inference/train/agg/generation_tokens_total/delta"] / active
    )

    # the run summary went to the JSONL sink at stop(), with run_status
    polls, jsonl_summary = read_jsonl(path)
    assert len(polls) > 10
    # one row per poll: a window's keys ride in the row of the poll that stopped it
    steps = [p["step"] for p in polls]
    assert steps == sorted(set(steps)), steps
    for label, keys in (("train", train_keys), ("eval", eval_keys)):
        [row] = [p["metrics"] for p in polls if f"inference/{label}/polls" in p["metrics"]]
        assert {k: row[k] for k in keys} == keys
        assert row["inference/agg/engines_reporting"] > 0  # ... with that poll's own keys
    assert jsonl_summary["run_status"] == "success"
    k = "inference_summary/combined/agg/generation_tokens_total/delta"
    assert jsonl_summary[k] == summary[k]
    assert (
        jsonl_summary["inference_summary/idle/agg/prompt_tokens_total/delta"]
        == (summary["inference_summary/idle/agg/prompt_tokens_total/delta"])
    )


async def test_run_status_failed_reaches_every_sink(tmp_path: Path) -> None:
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    async with rig() as r:
        c = r.collector(sinks=[JsonlSink(p) for p in paths])
        await c.poll()
        t0 = r.truth()
        await step_and_poll(r, c)
        await c.window("train").astart()  # left open: stop() closes it
        r.fleet.step(1.0)
        await c.stop("failed")
        t1 = r.truth()
    for p in paths:
        _, summary = read_jsonl(p)
        assert summary["run_status"] == "failed"
        got = summary["inference_summary/combined/agg/generation_tokens_total/delta"]
        assert got == t1["generation_tokens_total"] - t0["generation_tokens_total"]
        assert "inference_summary/train/agg/generation_tokens_total/delta" in summary


# --------------------------------------------------------------------------- misuse


async def test_window_misuse_raises_and_takes_no_scrape() -> None:
    async with rig() as r:
        c = r.collector()
        await c.poll()
        train = c.window("train")

        async def refused(coro: Awaitable[object], match: str) -> None:
            step = polls(c)
            with pytest.raises(WindowError, match=match):
                await coro
            assert polls(c) == step, "a refused action must not scrape"

        await refused(train.apause(), r"cannot pause window 'train': it is not started")
        await refused(train.aresume(), r"cannot resume window 'train': it is not started")
        await refused(train.astop(), r"cannot stop window 'train': it is not open")
        await refused(c.window("idle").astart(), r"'idle' is reserved")
        await refused(c.window("combined").astart(), r"'combined' is reserved")
        for scope in ("rl", "agg", "decode", "health"):  # names of other keys' scopes
            await refused(c.window(scope).astart(), rf"'{scope}' names other keys")
        await train.astart()
        await refused(train.astart(), r"window 'train' is already open; stop it first")
        await refused(train.aresume(), r"cannot resume window 'train': it is active")
        await train.apause()
        await refused(train.apause(), r"cannot pause window 'train': it is paused")
        await refused(train.astart(), r"already open")
        await train.aresume()
        await train.astop()
        await refused(train.astop(), r"cannot stop window 'train': it is not open")
        await refused(train.apause(), r"not started")
        await c.stop()


def test_window_misuse_sync_api_raises_in_the_caller_thread() -> None:
    fleet = SimFleet.build(1, dp=1, seed=5)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, timeout=2.0, fetch_model_info=False)
        c.start_background()  # polls at once, then every hour
        try:
            deadline = time.monotonic() + 120  # the first poll, however loaded the machine
            while c.last is None and time.monotonic() < deadline:
                time.sleep(0.01)
            w = c.window("eval")
            with pytest.raises(WindowError, match="cannot pause window 'eval'"):
                w.pause()
            step = polls(c)
            w.start()
            assert polls(c) == step + 1  # a boundary scrapes
            with pytest.raises(WindowError, match="already open"):
                w.start()
            assert polls(c) == step + 1
            fleet.step(1.0)
            keys = w.stop()
            with pytest.raises(WindowError, match="not open"):
                w.stop()
        finally:
            c.stop_background()
    assert keys["inference/eval/agg/generation_tokens_total/delta"] > 0


@pytest.mark.inline_only
def test_a_sync_boundary_from_the_collectors_own_loop_is_refused_and_changes_nothing() -> None:
    """Misuse (a sync call on the collector's loop thread) raises before the window's declared
    state changes: the same window then starts normally from the trainer's thread."""
    fleet = SimFleet.build(1, dp=1, seed=5)
    fleet.step(2.0)
    with FleetServer(fleet) as server:
        c = Collector(server.urls, interval=3600, timeout=2.0, fetch_model_info=False)
        c.start_background()
        try:
            w = c.window("train")

            async def on_the_loop() -> None:
                w.start()

            loop = c._background.loop
            assert loop is not None
            fut = asyncio.run_coroutine_threadsafe(on_the_loop(), loop)
            with pytest.raises(WindowError, match="own loop"):
                fut.result(60)
            w.start()  # not "already open": the refused call declared nothing
            fleet.step(1.0)
            keys = w.stop()
        finally:
            c.stop_background()
    assert keys["inference/train/agg/generation_tokens_total/delta"] > 0


# --------------------------------------------------------------------------- resume


async def test_resumed_collector_continues_the_run_summary(tmp_path: Path) -> None:
    """A trainer checkpoints, dies and resumes: the second collector, loaded with the first's
    state, publishes the same run totals as one that watched the whole time."""
    async with rig() as r:
        whole = r.collector()
        first = r.collector()

        async def both(fn: Callable[[Collector], Awaitable[object]]) -> None:
            await fn(whole)
            await fn(first)

        await both(lambda c: c.poll())
        for c in (whole, first):
            await c.window("train").astart()
        await step_and_poll(r, first)
        await whole.poll()
        r.fleet.step(1.0)
        for c in (whole, first):
            await c.window("train").astop()
        r.fleet.step(1.0)
        for c in (whole, first):
            await c.window("eval").astart()
        r.fleet.step(1.0)
        for c in (whole, first):
            await c.window("eval").astop()
        state = json.loads(json.dumps(first.state_dict()))  # a checkpoint is plain JSON
        await first.stop()  # the process ends (no fleet step after its last poll)

        second = r.collector(sinks=[JsonlSink(tmp_path / "resumed.jsonl")])
        second.load_state_dict(state)
        await second.poll()  # fresh baselines
        await whole.poll()
        for c in (whole, second):
            await c.window("train").astart()
        r.fleet.step(1.0)
        await second.poll()
        await whole.poll()
        r.fleet.endpoint("server0").restart()  # even a restart after the resume
        r.fleet.step(1.0)
        for c in (whole, second):
            await c.window("train").astop()
        r.fleet.step(1.0)
        for c in (whole, second):
            await c.stop()
    # float values, and the run status (str)
    a: dict[str, Any] = whole.summary()
    b: dict[str, Any] = second.summary()
    _, published = read_jsonl(tmp_path / "resumed.jsonl")
    compared = 0
    for key, value in a.items():
        if key.endswith("/delta") and ("/combined/" in key or "/train/" in key or "/eval/" in key):
            assert b.get(key) == pytest.approx(value, rel=1e-12, abs=1e-9), key
            assert published.get(key) == pytest.approx(value, rel=1e-12, abs=1e-9), key
            compared += 1
    assert compared > 100
    assert b["inference_summary/train/agg/generation_tokens_total/delta"] > 0
    assert b["inference_summary/eval/polls"] == a["inference_summary/eval/polls"]


# --------------------------------------------------------------------------- SkyRL preset, roles


async def test_skyrl_preset_keys_with_roles() -> None:
    async with rig() as r:
        c = r.collector(schema="skyrl")
        await c.poll()
        t0 = r.truth_all()
        train = c.window("train")
        await train.astart()
        await step_and_poll(r, c, n=2)
        r.fleet.step(1.0)
        keys = await train.astop()
        t1 = r.truth_all()
        poll_keys = dict((await c.poll()).keys)
        await c.stop()
        summary: dict[str, Any] = c.summary()  # float values, and the run status (str)
    for sub in ("", "prefill/", "decode/"):
        for name in ("generation_throughput_tok_s", "prompt_throughput_tok_s", "ttft_seconds_p90"):
            assert f"vllm/train/{sub}{name}" in keys, sub + name
    assert "vllm/generation_throughput_tok_s" in poll_keys
    assert "vllm/decode/num_requests_running" in poll_keys
    assert not any(k.startswith("inference") for k in (*keys, *poll_keys, *summary))
    secs = summary["vllm_correct_aggregate/train/measurement_seconds"]
    for sub, scope in (("", "agg"), ("prefill/", "prefill"), ("decode/", "decode")):
        base = f"vllm_correct_aggregate/train/{sub}"
        want = diff(t1[scope], t0[scope])
        assert summary[base + "output_tokens_total"] == want["generation_tokens_total"]
        assert summary[base + "prompt_tokens_total"] == want["prompt_tokens_total"]
        assert summary[base + "measurement_seconds"] == secs
    assert keys["vllm/train/generation_throughput_tok_s"] == pytest.approx(
        summary["vllm_correct_aggregate/train/output_tokens_total"] / secs
    )
    assert "vllm_correct_aggregate/combined/output_tokens_total" in summary
    assert summary["run_status"] == "success"


async def test_disaggregated_tails_are_role_aware() -> None:
    async with rig() as r:
        c = r.collector()
        await c.poll()
        await step_and_poll(r, c)
        assert c.last is not None
        healthy = dict(c.last.keys)
        r.fleet.endpoint("decode0").stall(engine=0)
        await step_and_poll(r, c, n=2)
        assert c.last is not None
        sick = dict(c.last.keys)
        await c.stop()

    def rates(keys: Mapping[str, float], role: str | None = "any") -> dict[str, float]:
        out = {}
        for k, v in keys.items():
            parts = k.split("/")
            if len(parts) == 3 and parts[2] == "generation_tokens_total:rate" and "." in parts[1]:
                ep = parts[1].split(".")[0]
                ep_role = None if ep.startswith("server") else ep.rstrip("0123456789")
                if (
                    role == "any"
                    or ep_role == role
                    or (role == "non-prefill" and ep_role != "prefill")
                ):
                    out[parts[1]] = v
        return out

    gen = "generation_tokens_total:rate"
    # healthy decode engines: prefill engines (few tokens by design) do not pin the agg tail
    assert min(rates(healthy, "prefill").values()) < min(rates(healthy, "non-prefill").values())
    assert healthy[f"inference/agg/{gen}/min"] == min(rates(healthy, "non-prefill").values()) > 0
    assert healthy[f"inference/decode/{gen}/min"] > 0
    assert healthy[f"inference/prefill/{gen}/min"] == min(rates(healthy, "prefill").values())
    # the stalled decode engine pins the decode tail (and the fleet's) to 0
    assert rates(sick)["decode0.0"] == 0
    assert sick[f"inference/decode/{gen}/min"] == 0
    assert sick[f"inference/agg/{gen}/min"] == 0
    assert sick[f"inference/prefill/{gen}/min"] == min(rates(sick, "prefill").values())
    # the sum still covers every engine, prefill included
    assert sick[f"inference/agg/{gen}/sum"] == pytest.approx(sum(rates(sick).values()))


@pytest.mark.inline_only  # reads in-process internals
async def test_boundary_rows_show_no_rates_over_a_sliver(tmp_path: Path) -> None:
    """A boundary scrape a moment after the regular poll made every chart dip (a rate over a
    fraction of a second: 0 tok/s, and 2x in the row before). The boundary row carries the
    window keys and instant values only; the next regular row shows the increase and the
    rate over the whole interval since the previous regular poll, exactly."""
    from fleetscope.sinks.jsonl import JsonlSink, read_jsonl

    path = tmp_path / "rows.jsonl"
    async with rig() as r:
        c = r.collector(sinks=[JsonlSink(path)])
        await c.poll()
        r.fleet.step(1.0)
        before = r.truth_all()
        await c.poll()  # regular
        train = c.window("train")
        await train.astart()  # the boundary, right after it, with no new tokens
        r.fleet.step(2.0)
        view = await c.poll()  # regular: the increase since the previous regular poll
        after = r.truth_all()
        await train.astop()
        await c.stop()
    polls, _ = read_jsonl(path)
    boundary = polls[2]["metrics"]
    assert "inference/agg/generation_tokens_total:rate/sum" not in boundary
    assert "inference/agg/generation_tokens_total/delta" not in boundary
    assert "inference/agg/num_requests_running/sum" in boundary  # instant values stay
    want = diff(after["agg"], before["agg"])["generation_tokens_total"]
    assert view.keys["inference/agg/generation_tokens_total/delta"] == want
    # the rate divides by each engine's seconds since the previous *regular* poll
    stats = view.result.stats
    shown = stats.seconds[stats.is_engine]
    raw = [i.delta.seconds for i in view.result.inputs if i.is_engine]
    assert all(s > r for s, r in zip(shown, raw, strict=True))
    assert view.keys["inference/agg/generation_tokens_total:rate/sum"] > 0


async def test_a_window_open_at_checkpoint_keeps_its_first_part(tmp_path: Path) -> None:
    """``state_dict()`` while a window is open, ``load_state_dict()`` into a new collector:
    the window goes on and its totals are the pre-checkpoint part plus what follows (the
    pre-checkpoint part was lost)."""
    import json

    async with rig() as r:
        c = r.collector()
        await c.poll()
        train = c.window("train")
        await train.astart()
        t0 = r.truth_all()
        r.fleet.step(1.0)
        await c.poll()
        t1 = r.truth_all()
        saved = json.loads(json.dumps(c.state_dict()))  # plain data
        await c.stop()

        c2 = r.collector()
        c2.load_state_dict(saved)
        await c2.poll()  # fresh baselines: what happened in between is not counted
        t2 = r.truth_all()
        r.fleet.step(1.0)
        await c2.poll()
        keys = await c2.window("train").astop()
        t3 = r.truth_all()
        await c2.stop()
    for scope in SCOPES:
        want = {k: (t1[scope][k] - t0[scope][k]) + (t3[scope][k] - t2[scope][k]) for k in t0[scope]}
        assert window_totals(keys, "inference/train", scope) == want, scope


def test_a_boundary_at_clock_zero_counts() -> None:
    """``now - (resumed_at or now)`` read a resume at clock 0.0 as no resume at all."""
    from fleetscope.stats.windows import WindowSet

    ws = WindowSet()
    ws.start("train", 0.0)
    w = ws.stop("train", 5.0)
    assert w.acc.active_seconds == 5.0


@pytest.mark.parametrize("change", ["restart", "layout"])
async def test_the_row_after_a_boundary_keeps_the_held_increase_of_a_restarted_engine(
    change: str,
) -> None:
    """A boundary poll holds its increases for the next regular row. An engine that restarted
    (or whose series layout changed) after the boundary lost them: the row showed only its
    counts since the restart. The row covers the whole interval since the previous regular
    poll: what the boundary held plus what came after, to the token (docs/bad-data.md §11)."""
    async with rig() as r:
        c = r.collector()
        await c.poll()
        r.fleet.step(1.0)
        await c.poll()  # regular
        before = r.truth_all()
        ep = r.fleet.endpoint("decode1")
        before_ep = r.truth(endpoint="decode1")
        r.fleet.step(1.0)
        train = c.window("train")
        await train.astart()  # boundary: holds an increase
        if change == "restart":
            ep.restart()
        else:
            ep.add_lazy_series()  # a new series: the engine's layout changes
        r.fleet.step(1.0)
        view = await c.poll()  # regular: everything since the previous regular poll
        after = r.truth_all()
        after_ep = r.truth(endpoint="decode1")
        await train.astop()
        await c.stop()
    want = diff(after["agg"], before["agg"])["generation_tokens_total"]
    assert view.keys["inference/agg/generation_tokens_total/delta"] == want
    # the restarted server is a decode server: its role's row is whole too
    want_decode = diff(after["decode"], before["decode"])["generation_tokens_total"]
    assert view.keys["inference/decode/generation_tokens_total/delta"] == want_decode
    assert after_ep["generation_tokens_total"] > before_ep["generation_tokens_total"]


async def wait_for_poll(c: Collector, step: int, deadline: float = 60.0) -> None:
    """Until the collector's own loop has taken poll ``step`` (however loaded the machine)."""
    end = time.monotonic() + deadline
    while polls(c) < step:
        assert time.monotonic() < end, f"the collector's loop took no poll {step}"
        await asyncio.sleep(0.01)


async def test_a_poll_sooner_than_half_an_interval_holds_its_row() -> None:
    """A manual ``poll()`` and the final poll at stop, moments after the loop's poll, would
    show a rate over a sliver (0.0 tok/s with requests running, or 3x the neighbours). While
    the loop runs, any poll less than half an interval after the last row that showed rates
    is held like a boundary: instant values only; its increases are the next row's, and the
    run summary counts every token (docs/rules.md §3.9). A collector that is not started is
    polled on the caller's own schedule: its rows show rates."""
    async with rig() as r:
        c = r.collector(interval=60.0)
        before = r.truth()
        await c.start()  # the loop polls at once, then every 60 s
        await wait_for_poll(c, 0)
        r.fleet.step(1.0)
        view = await c.poll()  # a sliver after the loop's poll
        await c.stop()  # the final poll: another sliver
        after = r.truth()
        summary = dict(c.summary())
        last = c.last
        manual = r.collector()  # never started: the caller's schedule
        await manual.poll()
        r.fleet.step(1.0)
        own = await manual.poll()
        await manual.stop()
    for row in (view, last):
        assert row is not None
        assert not [k for k in row.keys if k.endswith("/delta") or ":rate/" in k]
        assert row.keys["inference/agg/num_requests_running/sum"] > 0
    want = diff(after, before)["generation_tokens_total"]
    assert summary["inference_summary/combined/agg/generation_tokens_total/delta"] == want
    assert own.keys["inference/agg/generation_tokens_total/delta"] > 0
    assert own.keys["inference/agg/generation_tokens_total:rate/sum"] > 0


async def test_one_restart_with_an_unseen_tail_counts_once() -> None:
    """``restarts_unseen_tail`` counted 2 for one restart of a one-engine server (real vLLM:
    ``engine_restarts`` 1): the server's own row, which restarts with its engine, was counted
    as well."""
    async with rig() as r:
        c = r.collector()
        await c.poll()
        train = c.window("train")
        await train.astart()
        await step_and_poll(r, c)
        r.fleet.step(0.5)  # counts no scrape sees: the restart's unseen tail
        r.fleet.endpoint("decode1").restart()
        await step_and_poll(r, c, n=2)
        await train.astop()
        summary = dict(c.summary())
        await c.stop()
    got = {k.rsplit("/", 1)[1]: v for k, v in summary.items() if "/train/" in k}
    assert got["engine_restarts"] == 1
    assert got["restarts_unseen_tail"] == 1


async def test_an_endpoint_that_never_answered_costs_coverage() -> None:
    """An endpoint that failed every scrape (5 of 5) left window and run coverage at 1.0: the
    engines fleetscope never saw counted as present. Each counts as one engine (the fewest it
    can have), expected for every interval it was tried and never answered; the totals of the
    endpoints that answered stay exact (docs/bad-data.md §7)."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = Endpoint(f"http://127.0.0.1:{s.getsockname()[1]}", "dead")
    async with rig() as r:
        r.endpoints.append(dead)
        c = r.collector(timeout=5.0)
        await c.poll()
        t0 = r.truth()
        train = c.window("train")
        await train.astart()
        await step_and_poll(r, c, n=3)
        r.fleet.step(1.0)
        keys = await train.astop()
        t1 = r.truth()
        summary = dict(c.summary())
        await c.stop()
    engines = sum(len(ep.engines) for ep in r.fleet.endpoints)
    assert keys["inference/train/failed_scrapes"] == 4
    assert window_totals(keys, "inference/train") == diff(t1, t0)  # the others: exact
    # one unseen engine beside the fleet's, missing for (about) the window's whole length
    share = engines / (engines + 1)
    assert keys["inference/train/coverage"] == pytest.approx(share, abs=0.03)
    for label in ("train", "combined"):
        cov = summary[f"inference_summary/{label}/coverage"]
        assert cov == pytest.approx(share, abs=0.03), label
