"""Paused and asleep engine-seconds (docs/rl-lifecycle.md §5) against a simulated fleet over
real HTTP: the expected figures are rebuilt from the scrape times each poll reports (each
engine's state at a poll covers its interval since its previous scrape) and from what the test
itself did to the servers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from fleetscope.collector.core import Collector, FleetView
from fleetscope.identity import Role
from fleetscope.rl.states import asleep_from_gauge
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet
from fleetscope_sim.rl import PendingCall
from fleetscope_sim.rl_http import Answer

DP = {"server0": 1, "server1": 2, "server2": 1}
ROLE: dict[str, Role] = {"server0": "decode", "server1": "decode", "server2": "prefill"}


class Truth:
    """Expected engine-seconds per scope, from the polls' own scrape times."""

    def __init__(self) -> None:
        self.prev: dict[str, float] = {}
        self.paused: set[str] = set()
        self.asleep: set[str] = set()

    def interval(self, view: FleetView) -> dict[str, list[float]]:
        """Per scope: [paused s, asleep s] of this poll's intervals."""
        out: dict[str, list[float]] = {}
        for sc in view.result.scrapes:
            ep = sc.endpoint
            secs = sc.time - self.prev[ep] if ep in self.prev else 0.0
            self.prev[ep] = sc.time
            row = [
                DP[ep] * secs * (ep in self.paused or ep in self.asleep),
                DP[ep] * secs * (ep in self.asleep),
            ]
            for scope in ("agg", ROLE[ep], ep):
                acc = out.setdefault(scope, [0.0, 0.0])
                acc[0] += row[0]
                acc[1] += row[1]
        return out


@asynccontextmanager
async def rig(**kw: Any) -> AsyncIterator[tuple[SimFleet, FleetServer, Collector]]:
    fleet = SimFleet(seed=3)
    for name, dp in DP.items():
        fleet.add_endpoint(dp=dp, name=name, role=ROLE[name])
    fleet.step(4.0)
    server = FleetServer(fleet).start()
    eps = [Endpoint(server.url(n), name=n, role=ROLE[n]) for n in DP]
    kw.setdefault("interval", 3600)
    c = Collector(eps, timeout=2.0, fetch_model_info=False, discover_roles=False, **kw)
    try:
        yield fleet, server, c
    finally:
        await c.stop()
        server.stop()


async def step_and_poll(
    fleet: SimFleet, c: Collector, truth: Truth, sums: dict[str, list[float]] | None = None
) -> tuple[FleetView, dict[str, list[float]]]:
    fleet.step(1.0)
    await asyncio.sleep(0.02)
    view = await c.poll()
    iv = truth.interval(view)
    if sums is not None:
        for scope, (p, s) in iv.items():
            acc = sums.setdefault(scope, [0.0, 0.0])
            acc[0] += p
            acc[1] += s
    return view, iv


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


async def test_paused_and_sleeping_seconds_per_endpoint_role_fleet_window_and_run() -> None:
    async with rig(rl_probes=True) as (fleet, server, c):
        truth = Truth()
        run: dict[str, list[float]] = {}
        await step_and_poll(fleet, c, truth, run)  # baselines: no time covered
        view, iv = await step_and_poll(fleet, c, truth, run)
        k = view.keys
        assert k["inference/agg/engines_paused"] == 0 and k["inference/agg/engines_asleep"] == 0
        assert k["inference/agg/paused_engine_seconds"] == 0.0
        async with httpx.AsyncClient() as h:
            assert (await h.post(server.url("server1") + "/pause")).status_code == 200
        truth.paused.add("server1")
        view, iv = await step_and_poll(fleet, c, truth, run)
        k = view.keys
        assert k["inference/server1/engines_paused"] == 2
        assert k["inference/agg/engines_paused"] == 2 and k["inference/prefill/engines_paused"] == 0
        for scope in ("agg", "decode", "server1", "server0", "prefill"):
            assert close(k[f"inference/{scope}/paused_engine_seconds"], iv[scope][0]), scope
        assert iv["server1"][0] > 0
        # a pause across a window boundary: the window gets only its own part
        await c.window("train").astart()
        assert c.last is not None
        for scope, (p, _) in truth.interval(c.last).items():  # before the window: idle
            run[scope][0] += p
        win: dict[str, list[float]] = {}
        assert "inference/agg/paused_engine_seconds" not in c.last.keys  # held: boundary row
        assert c.last.keys["inference/agg/engines_paused"] == 2
        view, iv = await step_and_poll(fleet, c, truth, win)
        fleet.endpoint("server2").sleep(1)
        truth.asleep.add("server2")
        view, iv = await step_and_poll(fleet, c, truth, win)
        assert view.keys["inference/server2/engines_asleep"] == 1
        assert view.keys["inference/server2/engines_paused"] == 1  # a sleep pauses (vLLM)
        assert close(view.keys["inference/prefill/sleeping_engine_seconds"], iv["prefill"][1])
        async with httpx.AsyncClient() as h:
            await h.post(server.url("server1") + "/resume")
        truth.paused.discard("server1")
        view, iv = await step_and_poll(fleet, c, truth, win)
        assert view.keys["inference/server1/paused_engine_seconds"] == 0.0
        keys = await c.window("train").astop()
        for scope, (p, s) in truth.interval(c.last).items():  # the stop poll is in the window
            win.setdefault(scope, [0.0, 0.0])
            win[scope][0] += p
            win[scope][1] += s
        for scope in ("agg", "decode", "prefill", "server1", "server2"):
            assert close(keys[f"inference/train/{scope}/paused_engine_seconds"], win[scope][0])
            assert close(keys[f"inference/train/{scope}/sleeping_engine_seconds"], win[scope][1])
        assert 0 < keys["inference/train/server1/paused_share"] < 1
        assert keys["inference/train/server0/paused_share"] == 0
        summary: dict[str, Any] = c.summary()  # float values, and the run status (str)
        for scope in ("agg", "server1", "server2"):
            total = run[scope][0] + win[scope][0]
            assert close(
                summary[f"inference_summary/combined/{scope}/paused_engine_seconds"], total
            )
            assert close(
                summary[f"inference_summary/train/{scope}/paused_engine_seconds"], win[scope][0]
            )
        # a checkpoint keeps the sums
        state = json.loads(json.dumps(c.state_dict()))
    async with rig(rl_probes=False) as (_fleet, _server, c2):
        c2.load_state_dict(state)
        s2 = c2.summary()
        for key, v in summary.items():
            if "engine_seconds" in key or key.endswith("_share"):
                assert s2[key] == v, key


async def test_no_state_requests_until_rl_is_used_but_sleep_gauges_count() -> None:
    async with rig() as (fleet, _server, c):
        truth = Truth()
        await step_and_poll(fleet, c, truth)
        fleet.endpoint("server0").sleep(2)
        truth.asleep.add("server0")
        view, iv = await step_and_poll(fleet, c, truth)
        assert c.states.paused._probes == {} and c.states.sleeping._probes == {}
        assert "inference/agg/engines_paused" not in view.keys  # nobody asked /is_paused
        assert view.keys["inference/agg/engines_asleep"] == 1
        assert close(view.keys["inference/server0/sleeping_engine_seconds"], iv["server0"][1])
        c.set_policy_version("v0")
        view, iv = await step_and_poll(fleet, c, truth)
        assert set(c.states.paused._probes) == set(DP)
        assert view.keys["inference/agg/engines_paused"] == 1


async def test_dev_mode_off_is_asked_once_and_gauges_still_count() -> None:
    async with rig(rl_probes=True) as (fleet, _server, c):
        for n in DP:
            fleet.endpoint(n).rl.dev_mode = False
        truth = Truth()
        await step_and_poll(fleet, c, truth)
        view, _ = await step_and_poll(fleet, c, truth)
        assert all(p.never for p in c.states.paused._probes.values())
        assert "inference/agg/engines_paused" not in view.keys
        assert view.keys["inference/agg/engines_asleep"] == 0


def test_sleep_gauge_reading_on_real_vllm_bodies() -> None:
    from fleetscope import Parser
    from support.paths import DATA

    root = DATA / "real-vllm-rl" / "single"
    asleep = Parser().parse((root / "33_sleep_l1_asleep.prom").read_text(), time=0.0)
    awake = Parser().parse((root / "34_sleep_l1_after_wake.prom").read_text(), time=0.0)
    assert asleep_from_gauge(asleep["0"]) is True
    assert asleep_from_gauge(awake["0"]) is False


async def test_an_engine_paused_too_long_outside_a_sync_is_a_health_condition() -> None:
    from fleetscope.health import HealthThresholds

    # every paused interval is a few real milliseconds here: a tiny threshold stands for 60 s
    async with rig(rl_probes=True, health_thresholds=HealthThresholds(paused_seconds=1e-3)) as (
        fleet,
        server,
        c,
    ):
        truth = Truth()
        await step_and_poll(fleet, c, truth)
        view, _ = await step_and_poll(fleet, c, truth)
        assert view.keys["inference/health/engine_paused"] == 0
        async with httpx.AsyncClient() as h:
            assert (await h.post(server.url("server1") + "/pause")).status_code == 200
        await step_and_poll(fleet, c, truth)  # the pause is seen: its interval counts
        view, _ = await step_and_poll(fleet, c, truth)
        named = sorted(e.subject for e in view.result.events if e.condition == "engine_paused")
        assert named == ["server1.0", "server1.1"]  # both engines of the paused endpoint only
        assert view.keys["inference/health/engine_paused"] == 2
        async with c.weight_sync("v1"):  # the trainer paused it on purpose: not a condition
            view, _ = await step_and_poll(fleet, c, truth)
            assert not [e for e in view.result.events if e.condition == "engine_paused"]
        async with httpx.AsyncClient() as h:
            await h.post(server.url("server1") + "/resume")
        await step_and_poll(fleet, c, truth)
        view, _ = await step_and_poll(fleet, c, truth)
        assert view.keys["inference/health/engine_paused"] == 0


async def test_time_inside_a_weight_sync_never_counts_towards_engine_paused() -> None:
    """A trainer pauses an engine for a long sync and resumes it just after: the sync's seconds
    are no pause "while no weight sync is open". The streak restarts at the sync and counts only
    the intervals after its exit poll, all measured on the polls' own scrape times (whatever
    the machine's load), so each poll's expected events are known exactly."""
    from fleetscope.health import HealthThresholds

    threshold = 0.05  # stands for 60 s: the sync below lasts several times longer
    async with rig(
        rl_probes=True, health_thresholds=HealthThresholds(paused_seconds=threshold)
    ) as (fleet, server, c):
        truth = Truth()

        def paused_events(view: FleetView) -> list[float | None]:
            return [
                e.value
                for e in view.result.events
                if e.condition == "engine_paused" and e.subject == "server0.0"
            ]

        await step_and_poll(fleet, c, truth)  # baselines
        async with c.weight_sync("v1"):
            async with httpx.AsyncClient() as h:
                assert (await h.post(server.url("server0") + "/pause")).status_code == 200
            truth.paused.add("server0")
            in_sync = 0.0
            while in_sync < 4 * threshold:  # a sync far longer than the threshold
                view, iv = await step_and_poll(fleet, c, truth)
                assert view.keys["inference/server0/engines_paused"] == 1
                assert paused_events(view) == []
                in_sync += iv["server0"][0]
        # the exit poll's interval was inside the sync too
        assert c.last is not None
        in_sync += truth.interval(c.last)["server0"][0]
        assert paused_events(c.last) == []
        # still paused, no sync open: only the seconds from the exit poll on count
        outside = 0.0
        while True:
            view, iv = await step_and_poll(fleet, c, truth)
            outside += iv["server0"][0]
            values = paused_events(view)
            if outside < threshold:
                assert values == [], (values, outside, in_sync)
                continue
            assert len(values) == 1 and values[0] is not None, (values, outside, in_sync)
            assert close(values[0], outside), (values, outside, in_sync)
            assert view.keys["inference/health/engine_paused"] == 1
            break


async def test_one_missed_probe_is_retried_at_the_next_poll_and_repeated_misses_back_off() -> None:
    """A single failed ``/is_paused`` (a missed deadline on a loaded machine) leaves the state
    unknown for that poll only; a second failure in a row backs off 30 s (never asked meanwhile)."""
    async with rig(rl_probes=True) as (fleet, _server, c):
        rl = fleet.endpoint("server0").rl
        orig = rl.answer
        failing = {"on": False}
        asked: list[bool] = []

        def answer(
            method: str, path: str, body: bytes = b"", query: str = ""
        ) -> Answer | PendingCall | None:
            if path == "/is_paused":
                asked.append(failing["on"])
                if failing["on"]:
                    return 500, {"detail": "busy"}
            return orig(method, path, body, query)

        rl.answer = answer  # type: ignore[method-assign]
        truth = Truth()

        def paused(view: FleetView) -> bool | None:
            return view.result.endpoint_info["server0"].paused

        view, _ = await step_and_poll(fleet, c, truth)
        assert paused(view) is False and len(asked) == 1
        failing["on"] = True
        view, _ = await step_and_poll(fleet, c, truth)
        assert paused(view) is None and len(asked) == 2  # unknown, counted nowhere
        failing["on"] = False
        view, _ = await step_and_poll(fleet, c, truth)
        assert paused(view) is False and len(asked) == 3  # asked again at once: known again
        failing["on"] = True
        for _ in range(2):
            view, _ = await step_and_poll(fleet, c, truth)
        assert paused(view) is None and len(asked) == 5  # two misses in a row
        failing["on"] = False
        for _ in range(3):
            view, _ = await step_and_poll(fleet, c, truth)
            assert paused(view) is None  # backing off: not asked, still unknown
        assert len(asked) == 5
