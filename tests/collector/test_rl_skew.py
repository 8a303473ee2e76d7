"""Version skew (docs/rl-lifecycle.md §3): which tokens the stale share is over, the largest lag
when engines are ahead of the trainer, and announcements from a trainer's own thread. Against
the simulated fleet of ``test_rl_lifecycle.py``, stepped by hand between polls, so every token
count is compared with the fleet's ground truth to the token."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

import pytest
from test_rl_lifecycle import GEN, rig, step_and_poll

from fleetscope.collector.core import Collector
from fleetscope.identity import Role
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimFleet

pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes


async def test_the_stale_share_is_over_tokens_of_known_version_and_unknown_ones_are_beside_it() -> (
    None
):
    """server0 current, server2 stale, server1 (dp=2) unknown (no ``/weight_info``: dev mode
    off). The stale share divides by server0 + server2 only; server1's tokens are reported as
    ``unknown_version_generation_tokens`` / ``_share``, per poll, per window and in the run
    summary, where the tokens from before the first announcement are of unknown status too."""
    async with rig() as r:
        r.fleet.endpoint("server1").rl.dev_mode = False
        r.set_version("v0", "server0", "server2")
        c = r.collector()
        await c.poll()  # baselines
        pre0 = r.gens()
        await step_and_poll(r, c)  # generated before any policy version: status unknown
        pre1 = r.gens()
        c.set_policy_version("v0")
        c.set_policy_version("v1")
        r.set_version("v1", "server0")  # server2 misses it
        train = c.window("train")
        await train.astart()  # a boundary poll; nothing stepped since the last poll
        g0 = r.gens()
        view = await step_and_poll(r, c)
        g1 = r.gens()
        keys = await train.astop()
        summary = c.summary()
        await c.stop()
    d = {n: g1[n] - g0[n] for n in g1}
    stale, unknown, total = d["server2"], d["server1"], sum(d.values())
    known = d["server0"] + d["server2"]
    assert stale > 0 and unknown > 0 and d["server0"] > 0
    k = view.keys
    assert k["inference/rl/engines_stale"] == 1
    assert k["inference/rl/engines_unknown_version"] == 2
    assert k["inference/rl/stale_generation_tokens"] == stale
    assert k["inference/rl/stale_generation_share"] == stale / known
    assert k["inference/rl/unknown_version_generation_tokens"] == unknown
    assert k["inference/rl/unknown_version_generation_share"] == unknown / total
    w = "inference/train/rl/"
    assert keys[w + "stale_generation_tokens"] == stale
    assert keys[w + "generation_tokens"] == total
    assert keys[w + "stale_generation_share"] == stale / known
    assert keys[w + "unknown_version_generation_tokens"] == unknown
    assert keys[w + "unknown_version_generation_share"] == unknown / total
    s = "inference_summary/train/rl/"
    assert summary[s + "stale_generation_share"] == stale / known
    assert summary[s + "unknown_version_generation_tokens"] == unknown
    pre = sum(pre1.values()) - sum(pre0.values())
    assert pre > 0
    s = "inference_summary/combined/rl/"
    assert summary[s + "generation_tokens"] == total + pre
    assert summary[s + "stale_generation_share"] == stale / known
    assert summary[s + "unknown_version_generation_tokens"] == unknown + pre
    assert summary[s + "unknown_version_generation_share"] == (unknown + pre) / (total + pre)


async def test_engines_ahead_of_the_trainer_are_not_stale_and_lag_zero_at_most() -> None:
    """The trainer rolls back to an earlier version while every engine serves the later one:
    each endpoint's own lag is negative (it is ahead), but none is stale and the largest lag
    is 0, never negative."""
    async with rig() as r:
        r.set_version("v1")
        c = r.collector()
        await c.poll()
        c.set_policy_version("v0")
        c.set_policy_version("v1")
        view = await step_and_poll(r, c)
        assert view.keys["inference/rl/max_version_lag"] == 0
        c.set_policy_version("v0")  # a rollback: every engine is one version ahead
        g0 = r.gen()
        view = await step_and_poll(r, c)
        total = r.gen() - g0
        await c.stop()
    k = view.keys
    assert k["inference/rl/policy_version_index"] == 0
    assert k["inference/rl/engines_stale"] == 0
    assert k["inference/rl/engines_unknown_version"] == 0
    assert k["inference/rl/max_version_lag"] == 0
    for name in ("server0", "server1", "server2"):
        assert k[f"inference/{name}/weight_version_lag"] == -1
    assert total > 0
    assert k["inference/rl/stale_generation_tokens"] == 0
    assert k["inference/rl/stale_generation_share"] == 0  # known, current or ahead: not stale
    assert k["inference/rl/unknown_version_generation_tokens"] == 0


def test_a_version_announced_from_a_trainer_thread_is_reported_at_the_next_poll() -> None:
    """A synchronous trainer: the collector runs in its background thread, the trainer's own
    thread announces versions; the next poll compares every endpoint with the announced one."""

    async def serve() -> tuple[SimFleet, FleetServer]:
        fleet = SimFleet(seed=9)
        fleet.add_endpoint(dp=1)
        fleet.add_endpoint(dp=2)
        fleet.step(4.0)
        return fleet, FleetServer(fleet).start()

    fleet, server = asyncio.run(serve())
    try:
        for ep in fleet.endpoints:
            ep.update_weight_version("v0")
        eps = [Endpoint(u) for u in server.urls]
        c = Collector(eps, interval=3600, timeout=2.0, fetch_model_info=False, verify=False)
        c.start_background()
        c.poll_blocking()  # baselines, no version yet
        errors: list[BaseException] = []

        def trainer(*versions: str) -> None:
            try:
                for v in versions:
                    c.set_policy_version(v)
            except BaseException as e:  # reported by the test thread
                errors.append(e)

        t = threading.Thread(target=trainer, args=("v0",), name="trainer")
        t.start()
        t.join()
        assert not errors
        fleet.step(1.0)
        view = c.poll_blocking()
        assert view is not None
        k = view.keys
        assert k["inference/rl/policy_version_index"] == 0
        assert k["inference/rl/engines_stale"] == 0
        assert k["inference/rl/engines_unknown_version"] == 0
        # the trainer moves on; server1 (two engines) misses the update
        fleet.endpoint("server0").update_weight_version("v1")
        t = threading.Thread(target=trainer, args=("v1",), name="trainer")
        t.start()
        t.join()
        assert not errors
        assert c.policy_version == "v1"
        g0 = fleet.endpoint("server1").truth_total(GEN)
        fleet.step(1.0)
        view = c.poll_blocking()
        stale = fleet.endpoint("server1").truth_total(GEN) - g0
        summary = c.summary()
        c.stop_background()
    finally:
        server.stop()
    assert view is not None
    k = view.keys
    assert k["inference/rl/policy_version_index"] == 1
    assert k["inference/rl/engines_stale"] == 2
    assert k["inference/rl/max_version_lag"] == 1
    assert k["inference/server1/weight_version_lag"] == 1
    assert k["inference/server0/weight_version_lag"] == 0
    # the loop runs (interval 3600 s): a manual poll is held (rules §3.9), its increases
    # are not a row's rate; the run summary counts them to the token
    assert "inference/rl/stale_generation_tokens" not in k
    assert summary["inference_summary/combined/rl/stale_generation_tokens"] == stale > 0
    assert summary["inference_summary/rl/policy_versions"] == 2


async def test_versions_per_role_per_endpoint_in_windows_and_the_run_summary() -> None:
    """Two decode servers (one dp=2) and a prefill server. server1 misses ``v1`` for one
    interval of a window, then catches up. Per poll: per role the stale engines, largest lag
    and stale share (tokens to the token, from the simulator's truth), per endpoint the served
    version's index. Per window and run label: per endpoint the oldest, newest and last served
    version, per scope the largest lag, per role the shares; the summary names each endpoint's
    last version."""
    roles: dict[str, Role] = {"server0": "decode", "server1": "decode", "server2": "prefill"}
    fleet = SimFleet(seed=11)
    for name, role in roles.items():
        fleet.add_endpoint(dp=2 if name == "server1" else 1, name=name, role=role)
    for name in roles:
        fleet.endpoint(name).update_weight_version("v0")
    fleet.step(3.0)
    server = FleetServer(fleet).start()
    eps = [Endpoint(server.url(n), name=n, role=r) for n, r in roles.items()]
    c = Collector(eps, interval=3600, timeout=5.0, fetch_model_info=False, discover_roles=False)

    def gen(name: str) -> float:
        return fleet.endpoint(name).truth_total(GEN)

    async def step() -> Mapping[str, float]:
        fleet.step(1.0)
        await asyncio.sleep(0.01)
        return (await c.poll()).keys

    try:
        c.set_policy_version("v0")
        await c.poll()  # baselines
        await step()
        c.set_policy_version("v1")
        for name in ("server0", "server2"):
            fleet.endpoint(name).update_weight_version("v1")
        train = c.window("train")
        await train.astart()
        g0 = {n: gen(n) for n in roles}
        stale_poll = await step()  # server1 still serves v0
        g1 = {n: gen(n) for n in roles}
        fleet.endpoint("server1").update_weight_version("v1")
        caught_up = await step()
        g2 = {n: gen(n) for n in roles}
        keys = await train.astop()
        summary = c.summary()
    finally:
        await c.stop()
        server.stop()
    d1 = {n: g1[n] - g0[n] for n in roles}
    d2 = {n: g2[n] - g1[n] for n in roles}
    assert d1["server1"] > 0 and d1["server0"] > 0
    k = stale_poll
    assert k["inference/rl/decode/engines_stale"] == 2  # server1's two engines
    assert k["inference/rl/prefill/engines_stale"] == 0
    assert k["inference/rl/decode/max_version_lag"] == 1
    assert k["inference/rl/prefill/max_version_lag"] == 0
    assert k["inference/rl/decode/stale_generation_tokens"] == d1["server1"]
    share = d1["server1"] / (d1["server0"] + d1["server1"])
    assert k["inference/rl/decode/stale_generation_share"] == share
    assert k["inference/rl/prefill/stale_generation_share"] == 0.0
    assert k["inference/server1/weight_version_index"] == 0
    assert k["inference/server0/weight_version_index"] == 1
    assert caught_up["inference/rl/decode/engines_stale"] == 0
    assert caught_up["inference/server1/weight_version_index"] == 1
    w = "inference/train/"
    assert [keys[f"{w}server1/weight_version_index/{s}"] for s in ("oldest", "newest", "last")] == [
        0,
        1,
        1,
    ]
    assert keys[f"{w}server0/weight_version_index/oldest"] == 1
    assert keys[f"{w}rl/max_version_lag"] == 1 and keys[f"{w}rl/prefill/max_version_lag"] == 0
    decode_total = sum(d1[n] + d2[n] for n in ("server0", "server1"))
    assert keys[f"{w}rl/decode/generation_tokens"] == decode_total
    assert keys[f"{w}rl/decode/stale_generation_tokens"] == d1["server1"]
    assert keys[f"{w}rl/decode/stale_generation_share"] == d1["server1"] / decode_total
    s = "inference_summary/"
    assert summary[f"{s}train/server1/weight_version_index/oldest"] == 0
    assert summary[f"{s}combined/server1/weight_version_index/last"] == 1
    assert summary[f"{s}combined/rl/max_version_lag"] == 1
    assert {summary[f"{s}endpoints/{n}/weight_version"] for n in roles} == {"v1"}
