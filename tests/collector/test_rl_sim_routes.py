"""Sleep mode and weight transfer driven over real HTTP on the simulator's vLLM routes
(``/sleep``, ``/wake_up``, ``/release_kv_cache_memory``, ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``), with fleetscope's
figures checked against the simulator's ground truth: the per-operation histograms
(``endpoint.truth``, never reset), the call ledger (``SimRL.calls``), each engine's
``engine_sleep_state`` and ``/is_sleeping``, and the versions the transfers set.

The fleet is stepped by hand between polls (as in ``test_rl_states.py``); a call held in its
handler (``SimRL.hold``) is waited on through its ``entered`` event, never on a delay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.identity import Role
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, LoadProfile, SimFleet
from fleetscope_sim.rl_metrics import SLEEP_MODE, WEIGHT_UPDATE

pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

DP = {"server0": 1, "server1": 2, "server2": 1}
ROLE: dict[str, Role] = {"server0": "decode", "server1": "decode", "server2": "prefill"}
RL = "rl_weight_update_operation_duration_seconds"
SLEEP = "sleep_mode_operation_duration_seconds"
CHUNK = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4]], "ipc_handles": [{}]}


@asynccontextmanager
async def rig() -> AsyncIterator[tuple[SimFleet, FleetServer, Collector, httpx.AsyncClient]]:
    fleet = SimFleet(seed=11)
    for name, dp in DP.items():
        # server2 gets no traffic: its pauses complete (release_kv_cache_memory can succeed)
        load = LoadProfile(arrival_rate=0.0) if name == "server2" else None
        fleet.add_endpoint(dp=dp, name=name, role=ROLE[name], load=load)
    fleet.step(4.0)
    server = FleetServer(fleet).start()
    eps = [Endpoint(server.url(n), name=n, role=ROLE[n]) for n in DP]
    c = Collector(
        eps,
        interval=3600,
        timeout=2.0,
        fetch_model_info=False,
        discover_roles=False,
        verify=False,
        rl_probes=True,
    )
    try:
        async with httpx.AsyncClient(timeout=30.0) as h:
            yield fleet, server, c, h
    finally:
        await c.stop()
        server.stop()


async def step_and_poll(fleet: SimFleet, c: Collector, dt: float = 1.0) -> FleetView:
    fleet.step(dt)
    return await c.poll()


async def call(
    h: httpx.AsyncClient,
    server: FleetServer,
    name: str,
    path: str,
    body: Any = None,
    **query: str | int | list[str],
) -> tuple[int, Any]:
    params: list[tuple[str, str | int | float | bool | None]] = [
        (k, v) for k, vs in query.items() for v in (vs if isinstance(vs, list) else [vs])
    ]
    resp = await h.post(server.url(name) + path, json=body, params=params)
    return resp.status_code, resp.json()


def truth_of(fleet: SimFleet, name: str, op: str) -> tuple[int, float]:
    hist = fleet.endpoint(name).rl.truth(op)
    return (0, 0.0) if hist is None else (hist.count, hist.sum)


def assert_endpoint_rows(keys: Mapping[str, float], fleet: SimFleet) -> int:
    """Every endpoint's per-operation running totals are its truth; none is on an engine."""
    checked = 0
    for name in DP:
        for family, spec in ((RL, WEIGHT_UPDATE), (SLEEP, SLEEP_MODE)):
            for op in spec.operations:
                n, s = truth_of(fleet, name, op)
                child = f"inference/{name}/{family}{{operation={op}}}"
                if n == 0:
                    assert f"{child}_count" not in keys, child
                    continue
                assert keys[f"{child}_count"] == n, child
                assert keys[f"{child}_sum"] == pytest.approx(s, rel=1e-12, abs=1e-12), child
                checked += 1
        for i in range(DP[name]):
            own = [k for k in keys if k.startswith(f"inference/{name}.{i}/")]
            assert own and not [k for k in own if RL in k or SLEEP in k], (name, i)
            assert not [k for k in own if "operations_in_flight" in k], (name, i)
    return checked


def asleep_now(fleet: SimFleet) -> dict[str, int]:
    """Engines whose ``engine_sleep_state{awake}`` is 0 now (the simulator's ground truth)."""
    out = {}
    for name in DP:
        gauges = [e.truth.gauges["vllm:engine_sleep_state"] for e in fleet.endpoint(name).engines]
        out[name] = sum(1 for g in gauges if g[("awake",)] == 0.0)
    return out


async def test_sleep_mode_operations_and_asleep_engine_seconds_follow_the_gauge() -> None:
    async with rig() as (fleet, server, c, h):
        for i, name in enumerate(DP):
            secs = fleet.endpoint(name).rl.operation_seconds
            secs.update(sleep=0.25 * (i + 1), wake=0.015 * (i + 1), release_kv_cache_memory=0.04)
        prev: dict[str, float] = {}
        run: dict[str, float] = {}
        polls = 0

        async def check_poll(expect_paused: dict[str, bool]) -> Mapping[str, float]:
            nonlocal polls
            view = await step_and_poll(fleet, c)
            keys = view.keys
            asleep = asleep_now(fleet)
            for sc in view.result.scrapes:
                ep = sc.endpoint
                secs = sc.time - prev[ep] if ep in prev else 0.0
                prev[ep] = sc.time
                want = asleep[ep] * secs
                run[ep] = run.get(ep, 0.0) + want
                assert keys[f"inference/{ep}/engines_asleep"] == asleep[ep], ep
                assert keys[f"inference/{ep}/sleeping_engine_seconds"] == pytest.approx(
                    want, rel=1e-9, abs=1e-12
                ), ep
                paused = DP[ep] if expect_paused[ep] else 0
                assert keys[f"inference/{ep}/engines_paused"] == paused, ep
                # /is_sleeping and /is_paused say what the engines' state says
                ans = (await h.get(server.url(ep) + "/is_sleeping")).json()["is_sleeping"]
                assert ans == any(e.is_sleeping for e in fleet.endpoint(ep).engines), ep
                assert (await h.get(server.url(ep) + "/is_paused")).json()["is_paused"] is (
                    expect_paused[ep]
                )
            assert keys["inference/agg/engines_asleep"] == sum(asleep.values())
            polls += 1
            return keys

        none = dict.fromkeys(DP, False)
        await check_poll(none)  # baselines
        await check_poll(none)
        assert await call(h, server, "server1", "/sleep", level=1) == (
            200,
            {"status": "sleeping", "level": 1},
        )
        keys = await check_poll({**none, "server1": True})
        assert asleep_now(fleet)["server1"] == 2
        assert keys[f"inference/agg/{SLEEP}{{operation=sleep}}/delta"] == 1
        assert keys[f"inference/agg/{SLEEP}{{operation=sleep}}:mean/pooled"] == 0.5
        # level 0 only pauses the scheduler, yet every engine_sleep_state child is 0: asleep
        assert (await call(h, server, "server0", "/sleep", level=0))[0] == 200
        g = fleet.endpoint("server0").engines[0].truth.gauges["vllm:engine_sleep_state"]
        assert set(g.values()) == {0.0}
        # a partial wake leaves kv_cache asleep: still asleep, nothing resumes
        assert await call(h, server, "server1", "/wake_up", tags="weights") == (
            200,
            {"status": "sleeping", "tags": ["weights"]},
        )
        await check_poll({**none, "server0": True, "server1": True})
        assert await call(h, server, "server0", "/wake_up", tags="scheduling") == (
            200,
            {"status": "awake", "tags": ["scheduling"]},
        )
        # /resume resumes the scheduler only: server1 is unpaused but still asleep
        assert (await call(h, server, "server1", "/resume"))[0] == 200
        keys = await check_poll(none)
        assert keys["inference/server1/engines_asleep"] == 2
        assert keys["inference/server1/paused_engine_seconds"] == 0.0
        assert await call(h, server, "server1", "/wake_up") == (
            200,
            {"status": "awake", "tags": None},
        )
        assert (await call(h, server, "server2", "/sleep", level=2, mode="keep"))[0] == 200
        assert (await call(h, server, "server2", "/sleep", level=3))[0] == 400  # not observed
        keys = await check_poll({**none, "server2": True})
        # release_kv_cache_memory: a 500 on a busy server (observed too), a 200 on an idle one
        # after a completed pause: then every sleep-state child is 0 (asleep) until a wake-up
        assert (await call(h, server, "server2", "/wake_up"))[0] == 200
        assert (await call(h, server, "server0", "/pause"))[0] == 200
        status, body = await call(h, server, "server0", "/release_kv_cache_memory")
        assert status == 500 and "requires a completed pause" in body["error"]["message"]
        assert (await call(h, server, "server2", "/pause"))[0] == 200
        assert await call(h, server, "server2", "/release_kv_cache_memory") == (
            200,
            {"status": "kv_cache_released"},
        )
        assert (await call(h, server, "server2", "/resume"))[0] == 200
        keys = await check_poll({**none, "server0": True})
        assert keys["inference/server2/engines_asleep"] == 1
        assert (await call(h, server, "server0", "/resume"))[0] == 200
        assert (await call(h, server, "server2", "/wake_up"))[0] == 200
        keys = await check_poll(none)
        assert keys["inference/agg/engines_asleep"] == 0
        assert assert_endpoint_rows(keys, fleet) == 3 + 2 + 3  # (endpoint, operation) pairs
        summary = c.summary()
    for name in DP:
        got = summary[f"inference_summary/combined/{name}/sleeping_engine_seconds"]
        assert got == pytest.approx(run[name], rel=1e-9), name
    assert run["server1"] > 0 and run["server0"] > 0 and run["server2"] > 0
    # the call ledger: every sleep-mode call observed (the 400 not), with its seconds
    for name in DP:
        rl = fleet.endpoint(name).rl
        for op, path in (("sleep", "/sleep"), ("wake", "/wake_up")):
            calls = [x for x in rl.calls if x.path == path and x.status != 400]
            n, s = truth_of(fleet, name, op)
            assert n == len(calls) and s == pytest.approx(sum(x.seconds for x in calls))
    release = fleet.endpoint("server0").rl.call_counts[("POST", "/release_kv_cache_memory", 500)]
    assert release == 1 == truth_of(fleet, "server0", "release_kv_cache_memory")[0]


async def test_weight_transfer_sequence_per_operation_counts_and_versions() -> None:
    async with rig() as (fleet, server, c, h):
        for n in DP:
            fleet.endpoint(n).update_weight_version("v0")
        await step_and_poll(fleet, c)
        c.set_policy_version("v0")
        await step_and_poll(fleet, c)
        for i, n in enumerate(DP):
            secs = fleet.endpoint(n).rl.operation_seconds
            secs.update(init=0.01, start=0.002 * (i + 1), update=0.3 * (i + 1), finish=0.004)
        async with c.weight_sync("v1") as sync:
            for i, n in enumerate(DP):
                assert (await call(h, server, n, "/pause", mode="keep"))[0] == 200
                got = await call(h, server, n, "/init_weight_transfer_engine", {"init_info": {}})
                assert got == (200, {"message": "Weight transfer initialized"})
                got = await call(h, server, n, "/start_weight_update")
                assert got == (200, {"message": "Weight update started"})
                assert (await call(h, server, n, "/start_weight_update"))[0] == 500  # twice
                for _ in range(i + 1):
                    got = await call(h, server, n, "/update_weights", {"update_info": CHUNK})
                    assert got == (200, {"message": "Weights updated"})
                got = await call(h, server, n, "/finish_weight_update", {"weight_version": "v1"})
                assert got == (200, {"message": "Weight update finished"})
                assert (await call(h, server, n, "/resume"))[0] == 200
            fleet.step(0.5)
        assert c.last is not None
        row = c.last.result.keys  # the exit poll's row
        k = sync.keys
        for op in ("init", "start", "update", "finish"):
            count = sum(truth_of(fleet, name, op)[0] for name in DP)
            seconds = sum(truth_of(fleet, name, op)[1] for name in DP)
            assert k[f"inference/rl/sync/engine_update_count{{operation={op}}}"] == count, op
            got_seconds = k[f"inference/rl/sync/engine_update_seconds{{operation={op}}}"]
            assert got_seconds == pytest.approx(seconds, rel=1e-12), op
        assert k["inference/rl/sync/engine_update_count{operation=update}"] == 1 + 2 + 3
        assert k["inference/rl/sync/engine_update_count{operation=start}"] == 6  # 3 were 500s
        assert k["inference/rl/sync/engine_update_seconds{operation=update}"] == pytest.approx(
            0.3 * 1 + 0.6 * 2 + 0.9 * 3
        )
        assert row["inference/rl/engines_stale"] == 0  # /finish_weight_update set v1
        assert [fleet.endpoint(n).rl.transfer.completed for n in DP] == [
            [("v1", 1)],
            [("v1", 2)],
            [("v1", 3)],
        ]
        assert assert_endpoint_rows(row, fleet) == 4 * 3
        # a failed chunk ends the session: the finish fails too and sets no version
        c.set_policy_version("v2")
        for n in DP:
            assert (await call(h, server, n, "/start_weight_update"))[0] == 200
            bad = {"update_info": {"names": ["w"]}} if n == "server2" else {"update_info": CHUNK}
            status, body = await call(h, server, n, "/update_weights", bad)
            assert status == (500 if n == "server2" else 200)
            got = await call(h, server, n, "/finish_weight_update", {"weight_version": "v2"})
            assert got[0] == (500 if n == "server2" else 200)
        view = await step_and_poll(fleet, c)
        keys = view.keys
        assert "missing 2 required positional arguments" in body["error"]["message"]
        assert (await h.get(server.url("server2") + "/weight_info")).json() == {
            "weight_version": "v1"
        }
        assert keys["inference/rl/engines_stale"] == 1  # server2 still serves v1
        # a regular row after a sync's boundary rows covers the interval since the previous
        # regular poll (before any transfer call): the sync's calls and these
        for op, want in (("start", 6 + 3), ("update", 6 + 3), ("finish", 3 + 3)):
            assert sum(truth_of(fleet, name, op)[0] for name in DP) == want, op
            assert keys[f"inference/agg/{RL}{{operation={op}}}/delta"] == want, op
        assert assert_endpoint_rows(keys, fleet) == 4 * 3


async def test_in_flight_gauges_are_up_while_a_call_is_handled() -> None:
    async with rig() as (fleet, server, c, h):
        await step_and_poll(fleet, c)
        ep0, ep1 = fleet.endpoint("server0"), fleet.endpoint("server1")
        assert (await call(h, server, "server1", "/start_weight_update"))[0] == 200
        update, sleep = ep1.rl.hold("update"), ep0.rl.hold("sleep")
        task_u = asyncio.create_task(
            call(h, server, "server1", "/update_weights", {"update_info": CHUNK})
        )
        task_s = asyncio.create_task(call(h, server, "server0", "/sleep", level=1, mode="wait"))
        for hold in (update, sleep):
            assert await asyncio.to_thread(hold.entered.wait, 60.0)
        view = await step_and_poll(fleet, c)  # the server answers other requests meanwhile
        keys = view.keys
        assert not task_u.done() and not task_s.done()
        assert keys[f"inference/server1/{WEIGHT_UPDATE.in_flight[5:]}{{operation=update}}"] == 1
        assert keys[f"inference/server0/{SLEEP_MODE.in_flight[5:]}{{operation=sleep}}"] == 1
        assert f"inference/server0/{SLEEP}{{operation=sleep}}_count" not in keys  # no child yet
        # a /sleep in flight has paused the scheduler already; the gauge says asleep only after
        assert keys["inference/server0/engines_paused"] == 1
        assert keys["inference/server0/engines_asleep"] == 0
        assert [x.status for x in ep1.rl.calls if x.path == "/update_weights"] == [None]
        update.release()
        sleep.release()
        assert await task_u == (200, {"message": "Weights updated"})
        assert (await task_s)[0] == 200
        view = await step_and_poll(fleet, c)
        keys = view.keys
        assert keys[f"inference/server1/{WEIGHT_UPDATE.in_flight[5:]}{{operation=update}}"] == 0
        assert keys[f"inference/server0/{SLEEP_MODE.in_flight[5:]}{{operation=sleep}}"] == 0
        assert keys["inference/server0/engines_asleep"] == 1
        assert assert_endpoint_rows(keys, fleet) == 3  # server1 start, update; server0 sleep
