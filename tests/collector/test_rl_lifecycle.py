"""Policy versions, version skew and weight syncs (docs/rl-lifecycle.md) against a simulated
fleet over real HTTP.

As in ``test_windows.py`` the fleet is stepped by hand between polls, so the fleet's own ground
truth at each poll is known exactly: stale token counts and sync token counts are compared
with it to the token.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.health import CONDITIONS, HealthThresholds
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet
from fleetscope_sim.rl import PendingCall
from fleetscope_sim.rl_http import Answer

pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

GEN = "vllm:generation_tokens_total"
NAMES = ("server0", "server1", "server2")


@dataclass
class Rig:
    fleet: SimFleet
    server: FleetServer
    endpoints: list[Endpoint]

    def gen(self, endpoint: str | None = None) -> float:
        """Generated tokens so far (never reset): one endpoint's, or the fleet's."""
        if endpoint is not None:
            return self.fleet.endpoint(endpoint).truth_total(GEN)
        return sum(self.gen(n) for n in NAMES)

    def gens(self) -> dict[str, float]:
        return {n: self.gen(n) for n in NAMES}

    def collector(self, **kw: Any) -> Collector:
        kw.setdefault("interval", 3600)  # polls only when the test asks
        kw.setdefault("timeout", 2.0)
        kw.setdefault("fetch_model_info", False)
        kw.setdefault("discover_roles", False)
        kw.setdefault("verify", False)
        return Collector(self.endpoints, **kw)

    def set_version(self, version: str, *names: str) -> None:
        for n in names or NAMES:
            self.fleet.endpoint(n).update_weight_version(version)


@asynccontextmanager
async def rig(seed: int = 5) -> AsyncIterator[Rig]:
    """Three API servers: dp=1 (single-process exposition), dp=2 (multiprocess), dp=1."""
    fleet = SimFleet(seed=seed)
    fleet.add_endpoint(dp=1)
    fleet.add_endpoint(dp=2)
    fleet.add_endpoint(dp=1)
    fleet.step(4.0)
    server = FleetServer(fleet).start()
    try:
        yield Rig(fleet, server, [Endpoint(u) for u in server.urls])
    finally:
        server.stop()


async def step_and_poll(r: Rig, c: Collector, dt: float = 1.0) -> FleetView:
    r.fleet.step(dt)
    await asyncio.sleep(0.02)
    return await c.poll()


def rl_keys(keys: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in keys.items() if k.startswith("inference/rl/")}


# --------------------------------------------------------------------------- the simulator


async def test_simulator_answers_the_rl_routes() -> None:
    async with rig() as r:
        url = r.server.url("server1")
        async with httpx.AsyncClient() as h:
            assert (await h.get(url + "/weight_info")).json() == {"weight_version": "default"}
            resp = await h.post(url + "/update_weight_version", json={"new_version": "step-1"})
            assert resp.json() == {"success": True, "new_version": "step-1"}
            bad = await h.post(url + "/update_weight_version", json={"new_version": 3})
            assert bad.status_code == 400
            assert (await h.get(url + "/weight_info")).json() == {"weight_version": "step-1"}
            assert (await h.post(url + "/pause")).json() == {"status": "paused"}
            assert (await h.get(url + "/is_paused")).json() == {"is_paused": True}
            before = r.gen("server1")
            r.fleet.step(2.0)
            assert r.gen("server1") == before  # a keep-pause: nothing generated
            assert (await h.post(url + "/resume")).json() == {"status": "resumed"}
            r.fleet.step(2.0)
            assert r.gen("server1") > before
            r.fleet.endpoint("server2").rl.dev_mode = False
            off = await h.get(r.server.url("server2") + "/weight_info")
            assert off.status_code == 404 and off.json() == {"detail": "Not Found"}
            # the RL histogram is created lazily, engine-less, one child per operation
            body = (await h.get(url + "/metrics")).text
            assert "rl_weight_update_operation_duration_seconds" not in body
            r.fleet.endpoint("server1").simulate_weight_update("step-2")
            body = (await h.get(url + "/metrics")).text
            update = 'rl_weight_update_operation_duration_seconds_count{operation="update"} 1.0'
            assert update in body
            assert (await h.get(url + "/weight_info")).json() == {"weight_version": "step-2"}
        history = [v for v, _ in r.fleet.endpoint("server1").rl.version_history]
        assert history == ["step-1", "step-2"]


# --------------------------------------------------------------------------- versions


@pytest.mark.inline_only  # reads in-process internals
async def test_no_weight_info_requests_before_a_policy_version() -> None:
    async with rig() as r:
        c = r.collector()
        await c.poll()
        view = await step_and_poll(r, c)
        await c.stop()
    assert not rl_keys(view.keys)
    assert c.versions._probes == {}  # never asked
    assert "inference/health/stale_version" in view.keys
    assert "stale_version" in CONDITIONS


async def test_an_engine_that_misses_a_version_is_stale() -> None:
    async with rig() as r:
        c = r.collector(health_thresholds=HealthThresholds(stale_seconds=1.5))
        await c.poll()  # baselines
        r.set_version("v0")
        c.set_policy_version("v0")
        view = await step_and_poll(r, c)
        k = view.keys
        assert k["inference/rl/policy_version_index"] == 0
        assert k["inference/rl/engines_stale"] == 0
        assert k["inference/rl/engines_unknown_version"] == 0
        assert k["inference/rl/max_version_lag"] == 0
        assert k["inference/rl/stale_generation_share"] == 0
        train = c.window("train")
        await train.astart()
        w0 = r.gens()
        # the trainer moves to v1; server2 (one engine) misses the update
        announced = time.monotonic()
        c.set_policy_version("v1")
        r.set_version("v1", "server0", "server1")
        g0 = r.gens()
        view = await step_and_poll(r, c)
        g1 = r.gens()
        early = time.monotonic() - announced < 1.5
        k = view.keys
        assert k["inference/rl/policy_version_index"] == 1
        assert k["inference/rl/engines_stale"] == 1
        assert k["inference/rl/engines_unknown_version"] == 0
        assert k["inference/rl/max_version_lag"] == 1
        assert k["inference/server2/weight_version_lag"] == 1
        assert k["inference/server0/weight_version_lag"] == 0
        assert k["inference/server1/weight_version_lag"] == 0
        stale, total = g1["server2"] - g0["server2"], sum(g1.values()) - sum(g0.values())
        assert stale > 0
        assert k["inference/rl/stale_generation_tokens"] == stale
        assert k["inference/rl/stale_generation_share"] == stale / total
        if early:  # not yet for stale_seconds
            assert k["inference/health/stale_version"] == 0
        await asyncio.sleep(max(0.0, announced + 1.6 - time.monotonic()))
        g2 = r.gens()
        view = await step_and_poll(r, c)
        g3 = r.gens()
        assert view.keys["inference/health/stale_version"] == 1
        events = [e for e in view.result.events if e.condition == "stale_version"]
        assert [e.subject for e in events] == ["server2.0"]
        assert "'v0'" in events[0].message and "'v1'" in events[0].message
        # server2 catches up: nothing stale any more
        r.set_version("v1", "server2")
        view = await step_and_poll(r, c)
        g4 = r.gens()
        assert view.keys["inference/rl/engines_stale"] == 0
        assert view.keys["inference/health/stale_version"] == 0
        keys = await train.astop()
        g5 = r.gens()
        summary = c.summary()
        await c.stop()
    window_stale = (g1["server2"] - g0["server2"]) + (g3["server2"] - g2["server2"])
    window_total = sum(g5.values()) - sum(w0.values())
    assert g4 == g5  # nothing stepped between the last poll and the stop boundary
    assert keys["inference/train/rl/stale_generation_tokens"] == window_stale
    assert keys["inference/train/rl/generation_tokens"] == window_total
    assert keys["inference/train/rl/stale_generation_share"] == window_stale / window_total
    assert keys["inference/train/agg/generation_tokens_total/delta"] == window_total
    assert summary["inference_summary/train/rl/stale_generation_tokens"] == window_stale
    assert summary["inference_summary/combined/rl/stale_generation_tokens"] == window_stale
    assert summary["inference_summary/rl/policy_versions"] == 2


@pytest.mark.inline_only  # reads in-process internals
async def test_endpoints_without_weight_info_are_unknown_and_not_asked_again() -> None:
    async with rig() as r:
        r.fleet.endpoint("server1").rl.dev_mode = False  # 404, as without VLLM_SERVER_DEV_MODE
        c = r.collector()
        await c.poll()
        c.set_policy_version("default")  # vLLM's initial version, announced by the trainer
        view = await step_and_poll(r, c)
        assert view.keys["inference/rl/engines_unknown_version"] == 2  # server1: dp=2
        assert view.keys["inference/rl/engines_stale"] == 0
        assert "inference/server1/weight_version_lag" not in view.keys
        assert c.versions._probes["server1"].never
        assert c.versions._probes["server0"].answered
        task = c.versions._probes["server1"].task
        view = await step_and_poll(r, c)
        assert c.versions._probes["server1"].task is task  # not asked again
        assert view.keys["inference/rl/engines_unknown_version"] == 2
        await c.stop()


async def test_a_slow_weight_info_never_lengthens_the_poll() -> None:
    async with rig() as r:
        c = r.collector(timeout=0.5)
        await c.poll()
        c.set_policy_version("default")
        orig = r.fleet.endpoint("server0").rl.answer

        def slow(
            method: str, path: str, body: bytes = b"", query: str = ""
        ) -> Answer | PendingCall | None:
            if path == "/weight_info":
                time.sleep(2.0)  # blocks the simulator's loop: every request waits
            return orig(method, path, body, query)

        r.fleet.endpoint("server0").rl.answer = slow  # type: ignore[method-assign]
        t0 = time.monotonic()
        await step_and_poll(r, c)
        took = time.monotonic() - t0
        r.fleet.endpoint("server0").rl.answer = orig  # type: ignore[method-assign]
        await asyncio.sleep(2.2)  # the simulator's loop answers again before it stops
        await c.stop()
    # the scrape itself may fail (the simulator's loop is blocked) but the poll ends on time
    assert took < 0.5 * 2 + 0.8


# --------------------------------------------------------------------------- weight syncs


async def test_weight_sync_during_an_open_window_is_exact() -> None:
    async with rig() as r:
        r.set_version("v0")
        c = r.collector()
        await c.poll()
        c.set_policy_version("v0")
        train = c.window("train")
        await train.astart()
        w0 = r.gen()
        await step_and_poll(r, c)
        async with c.weight_sync("v1") as sync:
            s0 = r.gen()
            r.fleet.step(1.0)
            await c.poll()  # a poll inside the sync
            r.fleet.step(0.5)
            for i, n in enumerate(NAMES):
                r.fleet.endpoint(n).simulate_weight_update(
                    "v1", {"start": 0.01, "update": 0.25 * (i + 1), "finish": 0.005}
                )
            r.fleet.step(0.5)
            s1 = r.gen()
        assert c.last is not None
        row = c.last.result.keys  # the exit poll's row
        assert c.policy_version == "v1"
        await step_and_poll(r, c)
        keys = await train.astop()
        w1 = r.gen()
        summary = c.summary()
        await c.stop()
    k = sync.keys
    assert k["inference/rl/sync/generation_tokens"] == s1 - s0 > 0
    assert k["inference/rl/sync/engine_update_seconds{operation=update}"] == 0.25 + 0.5 + 0.75
    assert k["inference/rl/sync/engine_update_count{operation=update}"] == 3
    assert k["inference/rl/sync/engine_update_count{operation=start}"] == 3
    assert k["inference/rl/sync/count"] == 1
    assert 0 < k["inference/rl/sync/seconds"] < 30
    assert k["inference/rl/sync/seconds_total"] == k["inference/rl/sync/seconds"]
    for key, v in k.items():
        assert row[key] == v
    # the exit poll judges the engines against the new version already
    assert row["inference/rl/policy_version_index"] == 1
    assert row["inference/rl/engines_stale"] == 0
    # the window around the sync is exact too
    assert keys["inference/train/agg/generation_tokens_total/delta"] == w1 - w0
    assert summary["inference_summary/rl/sync/count"] == 1
    assert summary["inference_summary/rl/sync/generation_tokens_total"] == s1 - s0
    assert summary["inference_summary/rl/sync/engine_update_seconds{operation=update}"] == 1.5


async def test_a_failed_sync_announces_nothing() -> None:
    async with rig() as r:
        c = r.collector()
        await c.poll()
        c.set_policy_version("v0")
        with pytest.raises(RuntimeError):
            async with c.weight_sync("v1") as sync:
                raise RuntimeError("NCCL broke")
        summary = c.summary()
        await c.stop()
    assert c.policy_version == "v0"
    assert sync.keys["inference/rl/sync/failed"] == 1
    assert sync.keys["inference/rl/sync/count"] == 0
    assert summary["inference_summary/rl/sync/failed_total"] == 1


def test_weight_sync_from_a_synchronous_trainer() -> None:
    async def serve() -> tuple[SimFleet, FleetServer]:
        fleet = SimFleet(seed=9)
        fleet.add_endpoint(dp=1)
        fleet.add_endpoint(dp=2)
        fleet.step(4.0)
        return fleet, FleetServer(fleet).start()

    fleet, server = asyncio.run(serve())
    try:
        eps = [Endpoint(u) for u in server.urls]
        c = Collector(eps, interval=3600, timeout=2.0, fetch_model_info=False, verify=False)
        c.start_background()
        c.poll_blocking()
        with c.weight_sync("v1") as sync:
            s0 = fleet.truth_total(GEN)
            fleet.step(1.0)
            for ep in fleet.endpoints:
                ep.simulate_weight_update("v1")
            s1 = fleet.truth_total(GEN)
        assert c.policy_version == "v1"
        summary = c.summary()
        c.stop_background()
    finally:
        server.stop()
    assert sync.keys["inference/rl/sync/generation_tokens"] == s1 - s0 > 0
    assert sync.keys["inference/rl/sync/engine_update_count{operation=update}"] == 2
    assert summary["inference_summary/rl/sync/count"] == 1


# --------------------------------------------------------------------------- pause


async def test_a_pause_across_a_window_boundary() -> None:
    async with rig() as r:
        c = r.collector()
        await c.poll()
        url = r.server.url("server1")
        async with httpx.AsyncClient() as h:
            assert (await h.post(url + "/pause")).status_code == 200
            await step_and_poll(r, c)
            train = c.window("train")
            await train.astart()
            t0 = r.gens()
            view = await step_and_poll(r, c)
            assert view.keys["inference/server1.0/generation_tokens_total:rate"] == 0
            assert json.loads((await h.get(url + "/is_paused")).text) == {"is_paused": True}
            assert (await h.post(url + "/resume")).status_code == 200
            await step_and_poll(r, c)
            keys = await train.astop()
            t1 = r.gens()
        await c.stop()
    assert keys["inference/train/agg/generation_tokens_total/delta"] == sum(t1.values()) - sum(
        t0.values()
    )
    assert t1["server1"] > t0["server1"]  # it generated again after the resume


async def test_a_boundary_row_holds_the_stale_share_for_the_next_regular_row() -> None:
    async with rig() as r:
        r.set_version("v0")
        c = r.collector()
        await c.poll()
        c.set_policy_version("v0")
        c.set_policy_version("v1")
        r.set_version("v1", "server0", "server1")  # server2 stays on v0
        await step_and_poll(r, c)
        g0 = r.gens()
        r.fleet.step(1.0)
        train = c.window("train")
        await train.astart()  # a boundary poll
        assert c.last is not None
        row = c.last.result.keys
        assert row["inference/rl/engines_stale"] == 1  # instant keys are shown
        assert "inference/rl/stale_generation_share" not in row  # increases are held
        view = await step_and_poll(r, c)
        g1 = r.gens()
        await train.astop()
        await c.stop()
    stale, total = g1["server2"] - g0["server2"], sum(g1.values()) - sum(g0.values())
    assert view.keys["inference/rl/stale_generation_tokens"] == stale
    assert view.keys["inference/rl/stale_generation_share"] == stale / total


async def test_versions_and_sync_totals_survive_a_checkpoint() -> None:
    async with rig() as r:
        r.set_version("v0")
        c = r.collector()
        await c.poll()
        c.set_policy_version("v0")
        async with c.weight_sync("v1"):
            r.fleet.step(1.0)
            r.set_version("v1", "server0", "server1")
        view = await step_and_poll(r, c)
        stale = view.keys["inference/rl/stale_generation_tokens"]
        assert stale > 0
        saved = json.loads(json.dumps(c.state_dict()))
        before: dict[str, Any] = c.summary()  # float values, and the run status (str)
        await c.stop()
        c2 = r.collector()
        c2.load_state_dict(saved)
        await c2.poll()  # baselines again: nothing new counted
        view = await step_and_poll(r, c2)
        after = c2.summary()
        await c2.stop()
    assert c2.policy_version == "v1"
    assert view.keys["inference/rl/engines_stale"] == 1  # server2 asked afresh: still on v0
    more = view.keys["inference/rl/stale_generation_tokens"]
    key = "inference_summary/combined/rl/stale_generation_tokens"
    assert after[key] == before[key] + more
    assert (
        after["inference_summary/rl/sync/count"] == before["inference_summary/rl/sync/count"] == 1
    )


async def test_a_sync_open_at_a_checkpoint_continues_here_and_is_interrupted_when_restored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``state_dict()`` inside ``weight_sync``: the saving collector's sync goes on and closes
    normally; a collector restored from that state cannot close it (the handle lived in the
    saved process), so it reports it as interrupted, once, with what it covered, and never
    announces its version."""
    async with rig() as r:
        r.set_version("v0")
        c = r.collector()
        await c.poll()
        c.set_policy_version("v0")
        g0 = r.gen()
        async with c.weight_sync("v1") as sync:
            r.fleet.step(1.0)
            await c.poll()
            g1 = r.gen()
            saved = json.loads(json.dumps(c.state_dict()))
            r.set_version("v1")
        await c.stop()
        assert sync.keys["inference/rl/sync/count"] == 1  # it continued and closed normally
        assert sync.keys["inference/rl/sync/interrupted_total"] == 0
        (opened,) = saved["rl"]["syncs"]["open"]
        assert opened["version"] == "v1" and opened["tokens"] == g1 - g0 > 0
        c2 = r.collector()
        with caplog.at_level("WARNING", logger="fleetscope"):
            c2.load_state_dict(saved)
        assert any("'v1' was open at the checkpoint" in m for m in caplog.messages)
        view = await c2.poll()
        again = await step_and_poll(r, c2)
        summary = c2.summary()
        await c2.stop()
    k = view.keys
    assert k["inference/rl/sync/interrupted"] == 1
    assert k["inference/rl/sync/interrupted_generation_tokens"] == g1 - g0
    assert k["inference/rl/sync/interrupted_seconds"] == opened["seconds"] > 0
    assert k["inference/rl/sync/interrupted_total"] == 1
    assert k["inference/rl/sync/count"] == 0  # it never finished in this run
    assert "inference/rl/sync/interrupted" not in again.keys  # reported once
    assert again.keys["inference/rl/policy_version_index"] == 0  # "v1" was never announced
    assert summary["inference_summary/rl/sync/interrupted_total"] == 1
