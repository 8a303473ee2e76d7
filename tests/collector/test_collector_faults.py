"""Fault tests of the whole HTTP path: simulated vLLM servers (FleetServer, loopback) + Collector.

Every test drives the fleet in *frozen steps* (step the fleet, then poll), so what a poll sees is
deterministic and can be compared with the simulator's ground truth exactly. For every fault:

(a) a warning naming the endpoint is logged once, and a second failure inside the rate-limit
    interval logs nothing more;
(b) the loss is visible: ``scrape_failures``, ``endpoints_reporting``, ``engines_reporting``;
(c) the engines that did report have exact deltas (== truth), the failed endpoint's next
    success covers the whole longer interval (nothing lost), restarts keep totals exact;
(d) nothing raises into the caller and no poll blocks it (bounded duration, the event loop
    keeps running while a poll waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import httpx
import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.fleet.view import counter_increase
from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.util.warn import RateLimitedWarner
from fleetscope_sim import FleetServer, SimEndpoint, SimFleet
from support.promql import promql_bucket_quantile
from support.simclock import keep_clock_ahead

if TYPE_CHECKING:
    from fleetscope.stats.deltas import EngineDelta

COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
)
TIMEOUT = 0.5  # the collector's HTTP timeout in the tests of faults (slow servers...)
GENEROUS_TIMEOUT = 30.0  # in tests not about timeouts: healthy servers answer, however loaded


def poll_budget(timeout: float) -> float:
    """No poll may take longer, whatever the fault."""
    return 1.5 * timeout + 1.0


# The caller's event loop must keep running during a poll: fleetscope may not spend more than
# this much CPU time on the loop's thread at a stretch (between two ticks of a 10 ms ticker).
# CPU time, not wall time: on a loaded machine the whole process waits for a core (or for the
# GIL, held by a thread that waits for a core) for up to a second while the loop does nothing.
LOOP_STALL_BUDGET = 0.4

Truth = dict[str, dict[str, float]]  # engine id -> counter family -> ground-truth total


def deltas(view: FleetView) -> Mapping[str, EngineDelta]:
    """The poll's per-engine deltas, looked up by the rendered engine id (``server0.1``): an
    :class:`~fleetscope.identity.EngineId` key is equal to, and hashed like, its rendering."""
    return cast("Mapping[str, EngineDelta]", view.result.deltas)


def http_source(collector: Collector) -> HttpSource:
    """The collector's source: the HTTP source of the endpoints it was given."""
    return cast(HttpSource, collector.source)


def _dead_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class Rig:
    """A simulated fleet served on loopback and a collector polling it."""

    def __init__(
        self,
        fleet: SimFleet,
        server: FleetServer,
        collector: Collector,
        caplog: pytest.LogCaptureFixture,
        timeout: float = TIMEOUT,
    ) -> None:
        self.fleet = fleet
        self.server = server
        self.collector = collector
        self.caplog = caplog
        self.poll_budget = poll_budget(timeout)
        self.loop_stall_budget: float | None = LOOP_STALL_BUDGET

    def advance(self, dt: float) -> None:
        """One frozen step. Responses are built now (the simulator caches them per state), so
        a scrape only reads a warm cache: the simulator shares this process, its lock and its
        GIL, and building a 100 MB body during a poll would stall the collector for seconds."""
        self.fleet.step(dt)
        for ep in self.fleet.endpoints:
            ep.metrics_response()

    def truth(self) -> Truth:
        return {
            e.engine_id: {f: e.truth.counter(f) for f in COUNTERS} for e in self.fleet.engines()
        }

    async def poll(self) -> tuple[FleetView, Truth]:
        """One poll (must not raise, must stay within budget, must not stall the loop).
        Afterwards ``caplog`` holds the warnings of this poll only."""
        self.caplog.clear()
        stalls: list[tuple[float, float]] = []  # (loop thread's CPU seconds, wall seconds)
        done = asyncio.Event()
        # the interpreter's cyclic GC runs on whichever thread allocates: late in a long test
        # session one full collection can take 0.5 s of the loop thread's CPU, which is the
        # process' heap, not the collector's work: its CPU is left out of the stalls
        loop_thread = threading.get_ident()
        in_gc: list[float] = []
        gc_cpu = [0.0]

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if threading.get_ident() != loop_thread:
                return
            if phase == "start":
                in_gc.append(time.thread_time())
            elif in_gc:
                gc_cpu[0] += time.thread_time() - in_gc.pop()

        async def ticker() -> None:
            last, last_cpu, last_gc = time.monotonic(), time.thread_time(), gc_cpu[0]
            while not done.is_set():
                await asyncio.sleep(0.01)
                now, cpu, spent = time.monotonic(), time.thread_time(), gc_cpu[0]
                stalls.append((cpu - last_cpu - (spent - last_gc), now - last))
                last, last_cpu, last_gc = now, cpu, spent

        gc.callbacks.append(on_gc)
        tick = asyncio.create_task(ticker())
        t0 = time.monotonic()
        try:
            view = await self.collector.poll()
        finally:
            done.set()
            await tick
            gc.callbacks.remove(on_gc)
        elapsed = time.monotonic() - t0
        assert elapsed < self.poll_budget, f"poll took {elapsed:.2f} s"
        if self.loop_stall_budget is not None:
            cpu, wall = max(stalls, default=(0.0, 0.0))
            assert cpu < self.loop_stall_budget, (
                f"event loop stalled: {cpu:.2f} s of CPU on its thread ({wall:.2f} s)"
            )
        return view, self.truth()


@contextlib.asynccontextmanager
async def rig(
    fleet: SimFleet,
    caplog: pytest.LogCaptureFixture,
    *,
    extra: dict[str, str] | None = None,
    timeout: float = TIMEOUT,
    **kw: Any,
) -> AsyncIterator[Rig]:
    """Serve ``fleet`` and poll it (plus ``extra`` {name: url} endpoints) with a collector."""
    with FleetServer(fleet) as server:
        endpoints = [Endpoint(server.url(ep.name), ep.name, ep.role) for ep in fleet.endpoints]
        endpoints += [Endpoint(url, name) for name, url in (extra or {}).items()]
        collector = Collector(endpoints, interval=3600.0, timeout=timeout, **kw)
        try:
            yield Rig(fleet, server, collector, caplog, timeout)
        finally:
            await collector.stop(timeout=5.0)


def fleet_of(*specs: tuple[int, str], seed: int = 7) -> SimFleet:
    """Endpoints ``server0, server1...`` with (dp, mode) each."""
    fleet = SimFleet(seed=seed, wall_start=time.time())
    for dp, mode in specs:
        fleet.add_endpoint(dp=dp, mode=mode)  # type: ignore[arg-type]
    return fleet


def engines_of(fleet: SimFleet, *endpoints: str) -> list[str]:
    return [e.engine_id for name in endpoints for e in fleet.endpoint(name).engines]


def truth_delta(after: Truth, before: Truth, engines: list[str]) -> Truth:
    return {e: {f: after[e][f] - before[e][f] for f in COUNTERS} for e in engines}


def assert_exact(view: FleetView, expected: Truth) -> None:
    """Exactly the engines of ``expected`` contributed deltas, each equal to the truth, and
    the fleet delta of every counter is their sum."""
    counted = {
        eid
        for eid, d in view.result.deltas.items()
        if "." in eid and not d.baseline_only  # engine rows (endpoint rows have no dot)
    }
    assert counted == set(expected)
    for eid, want in expected.items():
        d = deltas(view)[eid]
        for family, value in want.items():
            got = counter_increase(d, family.removesuffix("_total"))
            assert got == value, (eid, family, got, value)
    for family in COUNTERS:
        key = f"inference/agg/{family.removeprefix('vllm:')}/delta"
        assert view.keys[key] == sum(w[family] for w in expected.values()), key


def assert_reporting(
    view: FleetView, *, failures: int, endpoints: int, expected: int, engines: int
) -> None:
    k = view.keys
    assert k["inference/agg/scrape_failures"] == failures
    assert k["inference/agg/endpoints_reporting"] == endpoints
    assert k["inference/agg/endpoints_expected"] == expected
    assert k["inference/agg/engines_reporting"] == engines
    assert view.endpoints_reporting == endpoints
    assert view.endpoints_expected == expected


def warnings_about(caplog: pytest.LogCaptureFixture, subject: str) -> list[str]:
    """fleetscope warnings of the last poll that mention ``subject``."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("fleetscope")
        and r.levelno >= logging.WARNING
        and subject in r.getMessage()
    ]


@pytest.fixture(autouse=True)
def _capture_fleetscope_warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fleetscope")


@pytest.fixture(scope="module", autouse=True)
def _warm_up() -> None:
    """One poll before the tests: the first request of a process imports httpx's and
    fleetscope's lazy modules (~0.1-0.2 s on the loop, once per process, not per collector),
    which the event-loop stall checks must not mistake for a poll blocking its caller."""

    async def poll_once() -> None:
        fleet = fleet_of((1, "single"))
        fleet.step(1.0)
        with FleetServer(fleet) as server:
            collector = Collector([server.url("server0")], interval=3600.0, timeout=5.0)
            await collector.poll()
            await collector.stop(timeout=5.0)

    asyncio.run(poll_once())


# ---------------------------------------------------------------------------------- dead endpoint


async def test_dead_endpoints_are_reported_not_raised_and_others_stay_exact(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = fleet_of((1, "single"), (2, "multiprocess"))
    dead = {"dead0": _dead_url(), "dead1": _dead_url()}

    def bad_callback(view: FleetView) -> None:
        raise RuntimeError("the trainer's callback is broken")

    async with rig(fleet, caplog, extra=dead, on_poll=bad_callback) as r:
        engines = engines_of(fleet, "server0", "server1")
        r.advance(2.0)
        view, t0 = await r.poll()
        # (a) one warning per dead endpoint, naming it and its URL; the callback error too
        for name, url in dead.items():
            msgs = warnings_about(caplog, f"scrape of {name} ")
            assert len(msgs) == 1 and url in msgs[0] and "connection" in msgs[0], msgs
        assert warnings_about(caplog, "on_poll callback raised")
        # (b) the loss is visible
        assert_reporting(view, failures=2, endpoints=2, expected=4, engines=3)
        assert view.keys["inference/agg/scrape_failures_total"] == 2
        assert set(view.engines) == set(engines)  # dead endpoints have no known engines

        before = t0
        for i in range(1, 3):
            r.advance(1.0)
            view, now = await r.poll()
            # (a) rate-limited: nothing more about the dead endpoints inside the interval
            assert warnings_about(caplog, "dead0") == []
            assert warnings_about(caplog, "dead1") == []
            assert http_source(r.collector)._warner.suppressed("dead0:scrape") == i
            # (b), (c)
            assert_reporting(view, failures=2, endpoints=2, expected=4, engines=3)
            assert view.keys["inference/agg/scrape_failures_total"] == 2 * (i + 1)
            assert_exact(view, truth_delta(now, before, engines))
            before = now
        summary = r.collector.summary()
    total = sum(
        now[e]["vllm:generation_tokens_total"] - t0[e]["vllm:generation_tokens_total"]
        for e in engines
    )
    assert summary["inference_summary/combined/agg/generation_tokens_total/delta"] == total


async def test_rate_limit_expires_and_reports_what_it_suppressed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = fleet_of((1, "single"))
    async with rig(fleet, caplog, extra={"dead0": _dead_url()}) as r:
        clock = [0.0]
        http_source(r.collector)._warner = RateLimitedWarner(
            logging.getLogger("fleetscope"),
            interval=60.0,
            clock=lambda: clock[0],
            prefix="fleetscope: ",
        )
        for expected in (1, 0, 0):  # one warning, then two suppressed
            r.advance(1.0)
            await r.poll()
            assert len(warnings_about(caplog, "scrape of dead0")) == expected
            clock[0] += 10.0
        clock[0] = 100.0  # past the interval: it warns again and says what it held back
        r.advance(1.0)
        await r.poll()
        msgs = warnings_about(caplog, "scrape of dead0")
        assert len(msgs) == 1 and "2 similar warning(s) suppressed" in msgs[0], msgs


async def test_http_client_setup_never_runs_on_the_callers_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With TLS verification on, building the httpx client loads the CA bundle (0.3-0.9 s of
    blocking work): it must happen in a worker thread, not on the trainer's event loop."""
    built_on: list[tuple[str, bool]] = []
    original = httpx.AsyncClient.__init__

    def spy(self: httpx.AsyncClient, *args: Any, **kwargs: Any) -> None:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        built_on.append((threading.current_thread().name, on_loop))
        original(self, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "__init__", spy)
    fleet = fleet_of((1, "single"))
    async with rig(fleet, caplog) as r:
        r.advance(1.0)
        await r.poll()
        r.advance(1.0)
        await r.poll()
    assert len(built_on) == 1, built_on  # one shared client
    assert not built_on[0][1], built_on


# ------------------------------------------------------------------ faults of a live endpoint


def _slow(ep: SimEndpoint) -> None:
    ep.set_slow(4 * TIMEOUT)


FAULTS: dict[str, tuple[Callable[[SimEndpoint], None], str]] = {
    "slow_past_timeout": (_slow, "timed out"),
    "http_500": (lambda ep: ep.set_http_error(500), "HTTP 500"),
    "garbage_body": (lambda ep: ep.set_garbage(), "bad exposition"),
    "truncated_body": (lambda ep: ep.set_truncated(), "truncated"),
    "body_100mb_over_cap": (lambda ep: ep.set_huge_body(100), "exceeds"),
    "wrong_content_type": (
        lambda ep: ep.set_content_type("text/html; charset=utf-8"),
        "wrong content type",
    ),
    "duplicate_series": (lambda ep: ep.set_duplicate_series(), "duplicate series"),
    "disconnect": (lambda ep: ep.set_disconnect(), "server1"),
}


async def test_nan_counters_are_left_out_not_the_scrape(caplog: pytest.LogCaptureFixture) -> None:
    """A NaN counter sample no longer fails the whole scrape (docs/bad-data.md): the bad series
    are left out with one warning naming the endpoint, counted in a key, and once they are
    valid again the totals are exact over the whole interval (their baselines were kept)."""
    fleet = fleet_of((1, "single"), (2, "multiprocess"))
    async with rig(fleet, caplog) as r:
        everyone = engines_of(fleet, "server0") + engines_of(fleet, "server1")
        r.advance(3.0)
        _, t0 = await r.poll()
        fleet.endpoint("server1").set_nan_values()
        r.advance(1.0)
        view, _ = await r.poll()
        assert view.endpoints_reporting == 2  # the scrape itself is valid
        assert view.keys["inference/agg/invalid_series"] > 0
        msgs = [m for m in warnings_about(caplog, "left out") if "server1" in m]
        assert msgs and all("NaN" in m for m in msgs), msgs
        fleet.endpoint("server1").clear_faults()
        r.advance(1.0)
        await r.poll()  # the series come back: counted from their kept baselines
        r.advance(1.0)
        view, t3 = await r.poll()
        assert view.keys["inference/agg/invalid_series"] == 0
    key = "inference_summary/combined/agg/generation_tokens_total/delta"
    want = sum(
        t3[e]["vllm:generation_tokens_total"] - t0[e]["vllm:generation_tokens_total"]
        for e in everyone
    )
    assert r.collector.summary()[key] == want


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_fault_is_reported_once_and_recovery_is_exact(
    fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    apply, reason = FAULTS[fault]
    fleet = fleet_of((1, "single"), (2, "multiprocess"))
    async with rig(fleet, caplog) as r:
        healthy = engines_of(fleet, "server0")
        faulty = engines_of(fleet, "server1")
        everyone = healthy + faulty
        url = r.server.url("server1")

        r.advance(3.0)
        _, t0 = await r.poll()  # baselines
        r.advance(1.0)
        view, t1 = await r.poll()
        assert_exact(view, truth_delta(t1, t0, everyone))
        assert warnings_about(caplog, "scrape of") == []

        apply(fleet.endpoint("server1"))
        if fault == "body_100mb_over_cap":
            # the in-process simulator copies the 100 MB into its socket buffer holding the GIL
            # (~0.3 s here): that stalls every thread of this process, not a fleetscope issue
            r.loop_stall_budget = None
        r.advance(1.0)
        view, t2 = await r.poll()
        # (a) one clear warning naming the endpoint and its URL
        msgs = warnings_about(caplog, "scrape of server1")
        assert len(msgs) == 1, msgs
        assert url in msgs[0] and reason in msgs[0], msgs
        # (b) the loss is visible; the silent engines are listed as not reporting
        assert_reporting(view, failures=1, endpoints=1, expected=2, engines=1)
        assert view.keys["inference/agg/scrape_failures_total"] == 1
        assert not view.engines["server1.0"].reporting
        assert view.engines["server1.1"].running is None  # missing is missing, never 0
        # (c) the engines that reported are exact
        assert_exact(view, truth_delta(t2, t1, healthy))

        r.advance(1.0)
        view, t3 = await r.poll()
        # (a) a second failure inside the interval logs nothing more about server1
        assert warnings_about(caplog, "server1") == []
        assert http_source(r.collector)._warner.suppressed("server1:scrape") == 1
        assert_reporting(view, failures=1, endpoints=1, expected=2, engines=1)
        assert view.keys["inference/agg/scrape_failures_total"] == 2
        assert_exact(view, truth_delta(t3, t2, healthy))

        fleet.endpoint("server1").clear_faults()
        r.loop_stall_budget = LOOP_STALL_BUDGET
        r.advance(1.0)
        view, t4 = await r.poll()
        # recovered: nothing lost, the failed scrapes left the baselines intact
        assert warnings_about(caplog, "scrape of") == []
        assert warnings_about(caplog, "restarted") == []
        assert_reporting(view, failures=0, endpoints=2, expected=2, engines=3)
        expected = truth_delta(t4, t3, healthy) | truth_delta(t4, t1, faulty)
        assert_exact(view, expected)
        assert view.keys["inference/agg/engine_restarts_total"] == 0
        d_faulty = deltas(view)["server1.0"]
        d_healthy = deltas(view)["server0.0"]
        assert not d_faulty.restarted
        assert d_faulty.seconds > d_healthy.seconds  # its own, longer interval
        summary = r.collector.summary()
    key = "inference_summary/combined/agg/generation_tokens_total/delta"
    assert summary[key] == sum(
        t4[e]["vllm:generation_tokens_total"] - t0[e]["vllm:generation_tokens_total"]
        for e in everyone
    )


# -------------------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("mode", ["single", "multiprocess"])
async def test_endpoint_restart_keeps_totals_exact(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = fleet_of((1, "single"), (2, mode))
    async with rig(fleet, caplog) as r:
        everyone = engines_of(fleet, "server0", "server1")
        restarted = engines_of(fleet, "server1")
        r.advance(5.0)
        _, t0 = await r.poll()
        r.advance(1.0)
        view, t1 = await r.poll()
        assert_exact(view, truth_delta(t1, t0, everyone))

        fleet.endpoint("server1").restart()
        r.advance(1.0)
        view, t2 = await r.poll()
        # every series of the restarted engines counts from 0: the totals equal the truth
        assert_exact(view, truth_delta(t2, t1, everyone))
        assert set(restarted) <= set(view.result.restarts)
        assert "server0.0" not in view.result.restarts
        n_restarts = len(view.result.restarts)
        assert view.keys["inference/agg/engine_restarts_total"] == n_restarts
        for eid in restarted:
            assert deltas(view)[eid].restarted
            msgs = warnings_about(caplog, f"{eid} restarted")
            assert len(msgs) == 1, msgs
        assert warnings_about(caplog, "scrape of") == []  # a restart is not a failed scrape
        assert_reporting(view, failures=0, endpoints=2, expected=2, engines=3)

        r.advance(1.0)
        view, t3 = await r.poll()  # the post-restart values are the new baselines
        assert_exact(view, truth_delta(t3, t2, everyone))
        assert view.result.restarts == []

        fleet.endpoint("server1").restart()  # it crashes again: counted, not logged again
        r.advance(1.0)
        view, t4 = await r.poll()
        assert_exact(view, truth_delta(t4, t3, everyone))
        assert view.keys["inference/agg/engine_restarts_total"] == 2 * n_restarts
        for eid in restarted:
            assert warnings_about(caplog, f"{eid} restarted") == []
        summary = r.collector.summary()
    assert summary["inference_summary/combined/agg/generation_tokens_total/delta"] == sum(
        t4[e]["vllm:generation_tokens_total"] - t0[e]["vllm:generation_tokens_total"]
        for e in everyone
    )


@pytest.mark.parametrize("mode", ["single", "multiprocess"])
async def test_one_dp_engine_restart_resets_only_that_engine(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = fleet_of((2, mode), (1, "single"))
    async with rig(fleet, caplog) as r:
        everyone = engines_of(fleet, "server0", "server1")
        r.advance(5.0)
        _, t0 = await r.poll()
        r.advance(1.0)
        _, t1 = await r.poll()

        fleet.endpoint("server0").restart_engine(1)
        r.advance(1.0)
        view, t2 = await r.poll()
        assert_exact(view, truth_delta(t2, t1, everyone))
        assert view.result.restarts == ["server0.1"]
        assert deltas(view)["server0.1"].restarted
        assert not deltas(view)["server0.0"].restarted
        assert view.keys["inference/agg/engine_restarts_total"] == 1
        msgs = warnings_about(caplog, "server0.1 restarted")
        assert len(msgs) == 1, msgs
        assert warnings_about(caplog, "server0.0 restarted") == []
        assert_reporting(view, failures=0, endpoints=2, expected=2, engines=3)

        r.advance(1.0)
        view, t3 = await r.poll()
        assert_exact(view, truth_delta(t3, t2, everyone))
        assert view.result.restarts == []
        summary = r.collector.summary()
    assert summary["inference_summary/combined/agg/prompt_tokens_total/delta"] == sum(
        t3[e]["vllm:prompt_tokens_total"] - t0[e]["vllm:prompt_tokens_total"] for e in everyone
    )


# ----------------------------------------------------------------- late engines and late series


async def test_endpoints_joining_late(caplog: pytest.LogCaptureFixture) -> None:
    """server1 (single process) starts after the first poll: its start time proves it, so its
    first values all count. server2 (DP, multiprocess: no start time exposed) starts late too,
    but nothing proves when: its first values are only a baseline. server3 was only failing
    at the first poll, running since before it: baseline only."""
    fleet = fleet_of((1, "single"), (1, "single"), (2, "multiprocess"), (1, "single"))
    loading = ["server1", "server2", "server3"]
    for name in loading:
        fleet.endpoint(name).set_http_error(503)  # vLLM still loading the model
    # about joins, not timeouts: the healthy server0 must answer however loaded the machine is
    async with rig(fleet, caplog, timeout=GENEROUS_TIMEOUT) as r:
        r.advance(2.0)
        view, t0 = await r.poll()
        assert_reporting(view, failures=3, endpoints=1, expected=4, engines=1)
        for name in loading:
            assert len(warnings_about(caplog, f"scrape of {name} ")) == 1

        # the simulated wall clock is set ahead of ours (however long the first poll took), so
        # these start times are well past the first poll plus the collector's 1 s clock-skew
        # margin: the processes started after it, and their timestamps say so
        keep_clock_ahead(fleet)
        r.advance(2.0)
        fleet.endpoint("server1").restart()
        fleet.endpoint("server2").restart()
        started = r.truth()
        for name in loading:
            fleet.endpoint(name).clear_faults()
        r.advance(1.0)
        view, t1 = await r.poll()
        assert_reporting(view, failures=0, endpoints=4, expected=4, engines=5)
        expected = truth_delta(t1, t0, engines_of(fleet, "server0")) | truth_delta(
            t1, started, engines_of(fleet, "server1")
        )
        assert_exact(view, expected)
        assert deltas(view)["server2.0"].baseline_only
        assert deltas(view)["server3.0"].baseline_only
        assert view.keys["inference/agg/engine_restarts_total"] == 0  # a new engine, no restart
        assert warnings_about(caplog, "restarted") == []

        r.advance(1.0)
        view, t2 = await r.poll()
        everyone = engines_of(fleet, "server0", "server1", "server2", "server3")
        assert_exact(view, truth_delta(t2, t1, everyone))


@pytest.mark.parametrize("mode", ["single", "multiprocess"])
async def test_series_created_later_count_from_zero(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = fleet_of((2, mode))
    async with rig(fleet, caplog) as r:
        engines = engines_of(fleet, "server0")
        r.advance(3.0)
        view, t0 = await r.poll()
        ep = fleet.endpoint("server0")
        ep.add_lazy_series("vllm:request_success_total", "timeout", share=0.5, engine=1)
        ep.add_lazy_series("vllm:prompt_tokens_by_source_total", "remote", share=0.5, engine=1)
        r.advance(3.0)
        view, t1 = await r.poll()
        truth = ep.engines[1].truth
        timeouts = truth.counter("vllm:request_success_total", "timeout")
        remote = truth.counter("vllm:prompt_tokens_by_source_total", "remote")
        assert timeouts > 0 and remote > 0  # the new series exist in this scrape
        assert 'finished_reason="timeout"' in ep.body().decode()
        # the whole value of a series that appeared after the previous scrape is its delta
        assert_exact(view, truth_delta(t1, t0, engines))
        k = view.keys
        assert k["inference/agg/request_success_total{finished_reason=timeout}/delta"] == timeouts
        assert k["inference/agg/prompt_tokens_by_source_total{source=remote}/delta"] == remote
        by_source = sum(
            truth.counter("vllm:prompt_tokens_by_source_total", s)
            for s in ("local_compute", "local_cache_hit", "external_kv_transfer", "remote")
        )
        assert by_source == truth.counter("vllm:prompt_tokens_by_source_total")
        d = deltas(view)["server0.1"]
        assert d.series_new >= 2 and not d.restarted
        assert k["inference/agg/engine_restarts_total"] == 0
        # a new series is not a fault, nor a restart
        assert warnings_about(caplog, "scrape of") == []
        assert warnings_about(caplog, "restarted") == []

        r.advance(1.0)
        view, t2 = await r.poll()
        assert_exact(view, truth_delta(t2, t1, engines))


async def test_histogram_bucket_appearing_later_keeps_quantiles_exact(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One engine starts exporting an extra bucket (1000) after the baseline: the new bound
    has no known delta, so the quantiles pool the bounds every engine can difference exactly,
    and equal PromQL's histogram_quantile on the true bucket increases at those bounds."""
    family = "vllm:request_prompt_tokens"
    fleet = fleet_of((2, "multiprocess"))
    ep = fleet.endpoint("server0")
    old_bounds = ep.engines[0].bounds[family]
    assert old_bounds[-1] == 500.0

    def cumulative() -> list[dict[float, int]]:
        out = []
        for e in ep.engines:
            hist = e.truth.histogram(family)
            assert hist is not None
            out.append(hist.cumulative_by_bound())
        return out

    async with rig(fleet, caplog) as r:
        r.advance(4.0)
        await r.poll()
        c0 = cumulative()
        ep.change_buckets(family, (*old_bounds, 1000.0), engine=0)
        for step in (1, 2):
            r.advance(3.0)
            view, _ = await r.poll()
            c1 = cumulative()
            shared = (*old_bounds, math.inf)
            pooled = [(b, sum(c1[i][b] - c0[i][b] for i in range(2))) for b in shared]
            count = view.keys[f"inference/agg/{family.removeprefix('vllm:')}/delta"]
            assert count == pooled[-1][1] > 0
            for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                want = promql_bucket_quantile(q, pooled)
                got = view.keys[f"inference/agg/request_prompt_tokens/{label}"]
                assert got == pytest.approx(want, rel=1e-12), (step, label)
            c0 = c1
            assert warnings_about(caplog, "scrape of") == []
            assert warnings_about(caplog, "restarted") == []
