"""Sharded collectors that survive themselves (issue 25), on a real local Ray cluster.

A simulated fleet is served on loopback and stepped only between polls (frozen states), so a
``ShardedCollector`` and a plain ``Collector`` polling one after another see the same bodies:

* a shard actor killed inside a window: a warning through the driver's logging naming the
  shard and its endpoints, the shard restarted, every endpoint reporting again within a few
  polls; a window stopped while its endpoints were down has exactly the coverage the lost
  engine-seconds leave, one spanning the loss is exact (the driver's baselines carry the
  endpoints over: their gap is counted at the restarted shard's first scrape);
* a shard with no restarts left: its endpoints go to the live shard at the next poll;
* a hung shard (its process stopped): no poll lasts longer than the deadline; it is killed
  and restarted after ``restart_after`` seconds of silence;
* two nodes (a second raylet started with ``ray start`` on this machine), one shard pinned
  to each: one collector's figures; the second node stopped mid-window: warned, its shard's
  restart cannot be placed, its endpoints reassigned, coverage short exactly by what was lost;
* the driver's pipeline in the isolation child (``isolation="process"``): one collector's
  figures, and a shard killed there is warned about in the trainer's logging;
* the shards' own warnings (a failing endpoint) reach the driver's logging, not only Ray's
  actor output (``log_to_driver=False`` here).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fleetscope.collector.core import Collector
from fleetscope.collector.sharded import ShardedCollector, ShardedSource
from fleetscope.fleet.view import FleetView
from fleetscope.identity import Role
from fleetscope.sources.base import Endpoint
from fleetscope_sim import FleetServer, SimFleet
from support.ray_cluster import local_ray, ray_node
from support.shards import (
    WindowCoverage,
    after_failures,
    assert_coverage,
    compare_keys,
    counters_only,
    fleetscope_warnings,
    poll_all,
    until_all_report,
)

pytestmark = pytest.mark.slow

LAYOUT: list[tuple[Role | None, int]] = [
    ("prefill", 1),
    ("decode", 2),
    ("decode", 1),
    (None, 2),
    ("decode", 1),
    ("prefill", 1),
]
GEN = "generation_tokens_total/delta"
# explicit roles, no side requests: nothing to discover before the figures agree
# a test's body: the fleet, its endpoints, the captured log
Scenario = Callable[[SimFleet, list[Endpoint], pytest.LogCaptureFixture], Coroutine[Any, Any, None]]
OPTS: dict[str, Any] = {
    "interval": 3600.0,
    "timeout": 30.0,
    "fetch_model_info": False,
    "discover_roles": False,
}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray("fsrecov-", log_to_driver=False) as ctx:
        yield ctx


def _fleet(seed: int) -> SimFleet:
    fleet = SimFleet(seed=seed)
    for role, dp in LAYOUT:
        fleet.add_endpoint(role=role, dp=dp)
    fleet.step(1.0)
    return fleet


def _endpoints(fleet: SimFleet, server: FleetServer) -> list[Endpoint]:
    roles = [role for role, _ in LAYOUT]
    return [
        Endpoint(server.url(ep.name), ep.name, role=role)
        for ep, role in zip(fleet.endpoints, roles, strict=True)
    ]


def _source(c: ShardedCollector) -> ShardedSource:
    assert c.sharded is not None  # in this process
    return c.sharded


def _truth(fleet: SimFleet) -> float:
    return fleet.truth_total("vllm:generation_tokens_total")


async def _stop(*collectors: Collector) -> None:
    for c in collectors:
        await c.stop()


def _warned(records: list[Any], shard: int, names: list[str], *words: str) -> str:
    """The driver-side warning about ``shard`` that names its endpoints and ``words``."""
    for msg in fleetscope_warnings(records):
        if (
            f"shard {shard} (" in msg
            and all(n in msg for n in names)
            and all(w in msg for w in words)
        ):
            return msg
    raise AssertionError((shard, names, words, fleetscope_warnings(records)))


def _on_fleet(seed: int, scenario: Scenario, caplog: pytest.LogCaptureFixture) -> None:
    """``scenario`` on a fresh simulated fleet served on loopback ports."""
    fleet = _fleet(seed)
    with FleetServer(fleet) as server:
        asyncio.run(scenario(fleet, _endpoints(fleet, server), caplog))


async def _settled(fleet: SimFleet, cols: dict[str, Collector]) -> dict[str, FleetView]:
    """Two more steps, each polled by every collector: the second row's deltas span the same
    interval for all (the first spans what each missed, or held at a boundary, since)."""
    for _ in range(2):
        fleet.step(2.0)
        views = await poll_all(cols)
    return views


# ----------------------------------------------------------------------------- a killed shard


def test_a_killed_shard_is_warned_restarted_and_reports_again(
    ray_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _on_fleet(21, _kill_and_restart, caplog)


async def _kill_and_restart(
    fleet: SimFleet, eps: list[Endpoint], caplog: pytest.LogCaptureFixture
) -> None:
    one = Collector(eps, **OPTS)
    sharded = ShardedCollector(eps, shards=3, **OPTS)
    cols: dict[str, Collector] = {"one": one, "sharded": sharded}
    truth0 = _truth(fleet)
    try:
        await poll_all(cols)  # baselines
        for c in cols.values():
            await c.window("eval").astart()  # across the loss and the recovery
        fleet.step(2.0)
        views = await poll_all(cols)
        assert compare_keys(views["sharded"].keys, views["one"].keys, "before") > 300
        for c in cols.values():
            await c.window("train").astart()  # stopped while the shard is down
        assert sharded.last is not None
        cover = WindowCoverage(sharded.last)
        fleet.step(2.0)
        cover.add((await poll_all(cols))["sharded"])
        victim = _source(sharded).pool.owned(1)
        ray.kill(sharded.shards[1])
        fleet.step(2.0)
        caplog.clear()
        train = {name: await c.window("train").astop() for name, c in cols.items()}
        cover.add(sharded.last)
        _warned(caplog.records, 1, victim, "died", "restarted it (restart 1 of 3)")
        assert sorted(cover.lost()) == sorted(victim)
        assert train["one"]["inference/train/coverage"] == 1.0
        assert_coverage(train["sharded"]["inference/train/coverage"], cover.coverage())
        assert (
            train["sharded"][f"inference/train/agg/{GEN}"]
            < train["one"][f"inference/train/agg/{GEN}"]
        )
        # the restarted shard answers: within a few polls (its process starts first)
        assert len(await until_all_report(sharded, len(eps))) <= 3
        views = await _settled(fleet, cols)
        assert compare_keys(views["sharded"].keys, views["one"].keys, "after", after_failures) > 300
        assert views["sharded"].keys["inference/collector/shard_restarts_total"] == 1.0
        assert views["sharded"].keys["inference/collector/shards_live"] == 3.0
        evals = {name: await c.window("eval").astop() for name, c in cols.items()}
    finally:
        await _stop(*cols.values())
    # nothing was lost for good: the gap was counted at the restarted shard's first scrape
    for name, k in evals.items():
        assert k[f"inference/eval/agg/{GEN}"] == _truth(fleet) - truth0, name
        assert k["inference/eval/coverage"] == 1.0, name
    skip = counters_only(evals["one"])
    assert compare_keys(evals["sharded"], evals["one"], "eval window", skip) > 200


# ----------------------------------------------------------------------------- no restarts left


def test_a_shard_with_no_restarts_left_hands_its_endpoints_to_the_live_shard(
    ray_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _on_fleet(22, _kill_for_good, caplog)


async def _kill_for_good(
    fleet: SimFleet, eps: list[Endpoint], caplog: pytest.LogCaptureFixture
) -> None:
    one = Collector(eps, **OPTS)
    sharded = ShardedCollector(eps, shards=2, max_restarts=0, **OPTS)
    cols: dict[str, Collector] = {"one": one, "sharded": sharded}
    truth0 = _truth(fleet)
    try:
        await poll_all(cols)
        for c in cols.values():
            await c.window("train").astart()
        fleet.step(2.0)
        await poll_all(cols)
        victim = _source(sharded).pool.owned(0)
        ray.kill(sharded.shards[0])
        fleet.step(2.0)
        caplog.clear()
        views = await poll_all(cols)
        assert views["sharded"].endpoints_reporting == len(eps) - len(victim)
        _warned(caplog.records, 0, victim, "died", "no restarts left", "go to the live shards")
        # the next poll gives them to shard 1, which scrapes them in the same call
        assert len(await until_all_report(sharded, len(eps))) == 1
        (where,) = await _source(sharded).where()
        assert where["shard"] == 1 and sorted(where["endpoints"]) == sorted(e.name for e in eps)
        views = await _settled(fleet, cols)
        assert compare_keys(views["sharded"].keys, views["one"].keys, "moved", after_failures) > 300
        assert views["sharded"].keys["inference/collector/shards_live"] == 1.0
        assert views["sharded"].keys["inference/collector/shard_restarts_total"] == 0.0
        train = {name: await c.window("train").astop() for name, c in cols.items()}
    finally:
        await _stop(*cols.values())
    for name, k in train.items():  # moved, not joined: the window expected them throughout
        assert k[f"inference/train/agg/{GEN}"] == _truth(fleet) - truth0, name
        assert k["inference/train/coverage"] == 1.0, name
    assert (
        train["sharded"][f"inference/train/agg/{GEN}"] == train["one"][f"inference/train/agg/{GEN}"]
    )


# ----------------------------------------------------------------------------- a hung shard


def test_a_hung_shard_never_holds_a_poll_past_its_deadline(
    ray_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _on_fleet(23, _hang, caplog)


async def _hang(fleet: SimFleet, eps: list[Endpoint], caplog: pytest.LogCaptureFixture) -> None:
    deadline, restart_after = 6.0, 20.0
    opts = {**OPTS, "timeout": 5.0}
    sharded = ShardedCollector(
        eps, shards=2, deadline=deadline, restart_after=restart_after, **opts
    )
    pid = 0
    try:
        await sharded.poll()  # the first poll waits for the shards to start
        where = await _source(sharded).where()
        pid, victim = where[1]["pid"], where[1]["endpoints"]
        os.kill(pid, signal.SIGSTOP)  # hung, not dead
        caplog.clear()
        started = time.monotonic()
        restarted = False
        while not restarted:
            assert time.monotonic() - started < restart_after + 120, "never restarted"
            fleet.step(1.0)
            t0 = time.monotonic()
            view = await sharded.poll()
            took = time.monotonic() - t0
            # the deadline, plus the driver's own work on a loaded machine
            assert took < deadline + 3.0, took
            failed = sorted(sc.endpoint for sc in view.result.scrapes if not sc.ok)
            restarted = any("restarted it" in m for m in fleetscope_warnings(caplog.records))
            if not restarted:
                assert failed == sorted(victim), (failed, victim)
                errors = {sc.error for sc in view.result.scrapes if not sc.ok}
                assert all(e and e.startswith("shard 1 ") for e in errors), errors
            await asyncio.sleep(1.0)
        assert time.monotonic() - started >= restart_after - 1.0
        _warned(caplog.records, 1, victim, "restarted it")
        await until_all_report(sharded, len(eps))
        assert (await _source(sharded).where())[1]["pid"] != pid
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):  # whatever Ray did with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if pid:
                    os.kill(pid, sig)
        await sharded.stop()


# ----------------------------------------------------------------------------- relayed warnings


def test_a_shards_warnings_reach_the_drivers_logging(
    ray_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _on_fleet(24, _relay, caplog)


async def _relay(fleet: SimFleet, eps: list[Endpoint], caplog: pytest.LogCaptureFixture) -> None:
    sharded = ShardedCollector(eps, shards=2, **OPTS)
    failing = eps[-1].name  # in shard 1
    try:
        await sharded.poll()
        fleet.endpoint(failing).set_http_error(500)
        caplog.clear()
        view = await sharded.poll()
        assert [sc.endpoint for sc in view.result.scrapes if not sc.ok] == [failing]
        # the shard's own rate-limited warning, relayed with its shard named
        relayed = [m for m in fleetscope_warnings(caplog.records) if f"scrape of {failing}" in m]
        assert len(relayed) == 1 and relayed[0].endswith("(shard 1)"), relayed
        await sharded.poll()  # the shard rate-limits its own warnings: not repeated
        assert len([m for m in fleetscope_warnings(caplog.records) if failing in m]) == 1
    finally:
        await sharded.stop()


# ----------------------------------------------------------------------------- two nodes


def test_shards_on_two_nodes_match_one_collector_and_survive_a_stopped_node(
    ray_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = _fleet(seed=25)
    with ray_node({"fsnode2": 1.0}) as node, FleetServer(fleet) as server:
        eps = _endpoints(fleet, server)
        asyncio.run(_two_nodes(fleet, eps, node, caplog))


async def _two_nodes(
    fleet: SimFleet, eps: list[Endpoint], node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    head = ray.get_runtime_context().get_node_id()
    placed: list[dict[str, Any]] = [
        {"scheduling_strategy": NodeAffinitySchedulingStrategy(head, soft=False)},
        {"resources": {"fsnode2": 0.01}},  # only the second node has it: no restart elsewhere
    ]
    opts = {**OPTS, "timeout": 10.0}
    one = Collector(eps, **opts)
    sharded = ShardedCollector(
        eps, shards=2, actor_options=placed, max_restarts=1, restart_after=15.0, **opts
    )
    cols: dict[str, Collector] = {"one": one, "sharded": sharded}
    truth0 = _truth(fleet)
    try:
        await poll_all(cols)
        where = await _source(sharded).where()
        assert [w["node"] for w in where] == [head, node.node_id]
        victim = where[1]["endpoints"]
        for c in cols.values():
            await c.window("eval").astart()
        for step in range(2):  # figures across two nodes are one collector's
            fleet.step(2.0)
            views = await poll_all(cols)
            assert compare_keys(views["sharded"].keys, views["one"].keys, f"step {step}") > 300
        for c in cols.values():
            await c.window("train").astart()
        assert sharded.last is not None
        cover = WindowCoverage(sharded.last)
        fleet.step(2.0)
        cover.add((await poll_all(cols))["sharded"])
        node.stop()
        fleet.step(2.0)
        caplog.clear()
        train = {name: await c.window("train").astop() for name, c in cols.items()}
        cover.add(sharded.last)
        assert sorted(cover.lost()) == sorted(victim)
        assert train["one"]["inference/train/coverage"] == 1.0
        assert_coverage(train["sharded"]["inference/train/coverage"], cover.coverage())
        _warned(caplog.records, 1, victim, "died", "restarted it (restart 1 of 1)")
        # the restart cannot be placed (its node is gone): after 15 s of silence it is given
        # up, and its endpoints go to the shard on the head node
        await until_all_report(sharded, len(eps), pause=1.0)
        _warned(caplog.records, 1, victim, "no restarts left", "go to the live shards")
        (alive,) = await _source(sharded).where()
        assert alive["node"] == head and len(alive["endpoints"]) == len(eps)
        views = await _settled(fleet, cols)
        assert compare_keys(views["sharded"].keys, views["one"].keys, "after", after_failures) > 300
        evals = {name: await c.window("eval").astop() for name, c in cols.items()}
    finally:
        await _stop(*cols.values())
    for name, k in evals.items():
        assert k[f"inference/eval/agg/{GEN}"] == _truth(fleet) - truth0, name
        assert k["inference/eval/coverage"] == 1.0, name


# ----------------------------------------------------------------------------- isolation child


def test_sharding_composes_with_the_isolation_child(
    ray_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _on_fleet(26, _in_child, caplog)


def _child_shards() -> list[tuple[str, str]]:
    """(name, namespace) of the shard actors the isolation child started."""
    listed: list[dict[str, str]] = ray.util.list_named_actors(all_namespaces=True)
    return sorted(
        (a["name"], a["namespace"]) for a in listed if a["name"].startswith("fleetscope-shard")
    )


async def _in_child(fleet: SimFleet, eps: list[Endpoint], caplog: pytest.LogCaptureFixture) -> None:
    one = Collector(eps, isolation="inline", **OPTS)
    sharded = ShardedCollector(eps, shards=2, isolation="process", **OPTS)
    cols: dict[str, Collector] = {"one": one, "sharded": sharded}
    assert sharded.sharded is None and sharded.shards == []  # in the child
    try:
        await sharded.wait_ready(180.0)
        await poll_all(cols)
        for step in range(2):
            fleet.step(2.0)
            views = await poll_all(cols)
            assert compare_keys(views["sharded"].keys, views["one"].keys, f"step {step}") > 300
        shards = _child_shards()
        assert [n.split("-")[1] for n, _ in shards] == ["shard0", "shard1"], shards
        name, namespace = shards[1]
        ray.kill(ray.get_actor(name, namespace=namespace))
        fleet.step(2.0)
        caplog.clear()
        view = await sharded.poll()
        assert view.endpoints_reporting < len(eps)
        # the child's warning, in the trainer's logging
        assert any("shard 1 (" in m and "died" in m for m in fleetscope_warnings(caplog.records))
        await until_all_report(sharded, len(eps))
        views = await _settled(fleet, cols)
        assert compare_keys(views["sharded"].keys, views["one"].keys, "after", after_failures) > 300
        assert views["sharded"].keys["inference/collector/shard_restarts_total"] == 1.0
    finally:
        await _stop(*cols.values())
    assert _child_shards() == []  # the child's shards are gone with it


def test_a_shards_clock_offset_is_estimated_from_the_round_trip() -> None:
    """NTP's estimate: with the call and its reply each delayed 1.5 s (a loaded machine), the
    offset is exact; the reply's arrival alone put every time of that shard 1.5 s into the
    driver's future (an engine failing at a window's stop was then expected for no time)."""
    from fleetscope.collector.sharded.source import clock_offset

    true_offset = 100.0  # driver clock - shard clock
    sent = 50.0
    received = sent + 1.5 - true_offset  # the call took 1.5 s to reach the shard
    replied = received + 0.4  # the shard scraped for 0.4 s
    arrived = replied + true_offset + 1.5  # the reply took 1.5 s back
    assert clock_offset(sent, received, replied, arrived) == true_offset
    assert clock_offset(sent, None, replied, arrived) == true_offset + 1.5  # a shard without it
