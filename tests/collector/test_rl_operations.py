"""The RL weight-update and sleep-mode histograms of real vLLM 0.32, per ``operation``.

The bodies in ``tests/data/real-vllm-rl/`` (see its README) were recorded around known RL calls
(``calls.json``). Those families have no ``engine`` label: they belong to the endpoint
(docs/rules.md §3.11), never to engine ``0``; ``operation`` is a breakdown label, so every
operation has its own child with exact counts, means and pooled quantiles.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from fleetscope.catalog import BREAKDOWN_LABELS
from fleetscope.exposition import Parser
from fleetscope.fleet.state import FleetState
from fleetscope.identity import Role
from fleetscope.rl.operations import operation_keys, poll_rows
from fleetscope.sources.base import ScrapeResult
from support.bodies import bucket_values, sample_values
from support.paths import DATA
from support.promql import promql_bucket_quantile

pytestmark = pytest.mark.usefixtures("isolation")  # both collector modes

DATA = DATA / "real-vllm-rl"
RUNS = {"single": ("00_before", "41_final"), "dp2": ("00_before", "20_final")}
RL = "rl_weight_update_operation_duration_seconds"
SLEEP = "sleep_mode_operation_duration_seconds"
# handler path -> (family, operation) as vLLM's `record(op)` names it
OPERATIONS = {
    "/init_weight_transfer_engine": (RL, "init"),
    "/shutdown_weight_transfer_engine": (RL, "shutdown"),
    "/start_weight_update": (RL, "start"),
    "/start_draft_weight_update": (RL, "start_draft"),
    "/update_weights": (RL, "update"),
    "/finish_weight_update": (RL, "finish"),
    "/sleep": (SLEEP, "sleep"),
    "/wake_up": (SLEEP, "wake"),
    "/release_kv_cache_memory": (SLEEP, "release_kv_cache_memory"),
}


def _calls(run: str) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = json.loads(
        (DATA / run / "calls.json").read_text(encoding="utf-8")
    )
    return calls


def _expected_counts(run: str) -> dict[tuple[str, str], int]:
    """Observed calls per (family, operation): failed calls (500) count, 400s do not."""
    out: dict[tuple[str, str], int] = {}
    for c in _calls(run):
        op = OPERATIONS.get(c.get("path", ""))
        if op is not None and c["status"] != 400:
            out[op] = out.get(op, 0) + 1
    return out


def _snapshot_wall(run: str, name: str) -> float:
    """The Unix time a snapshot was taken (the probe's clock, anchored by a timed call)."""
    calls = _calls(run)
    anchor = next(c for c in calls if "t_start" in c)
    start = datetime.fromisoformat(anchor["wall_utc"]).timestamp() - anchor["t_start"]
    snap = next(c for c in calls if c.get("metrics_snapshot") == f"{name}.prom")
    wall: float = start + snap["t"]
    return wall


def _observe(run: str, *, operations: bool = False) -> dict[str, float]:
    state, parser = FleetState(), Parser()
    keys: dict[str, float] = {}
    for i, name in enumerate(RUNS[run]):
        body = (DATA / run / f"{name}.prom").read_text(encoding="utf-8")
        wall, t = _snapshot_wall(run, name), 100.0 * (i + 1)
        sc = ScrapeResult(run, parser.parse(body, time=t, wall_time=wall), t, wall)
        result = state.observe([sc])
        keys = dict(result.keys)
        if operations:  # what the collector's pipeline adds to every poll
            keys.update(operation_keys(poll_rows(result.inputs), "inference"))
    return keys


def _from_text(before: str, after: str, series: str) -> float:
    """A cumulative sample's increase, read from the bodies' text (absent before: from 0)."""
    pattern = "^" + series.replace("{", r"\{").replace("}", r"\}") + "$"
    was = sample_values(before, pattern)
    return sample_values(after, pattern)[0] - (was[0] if was else 0.0)


def test_operation_is_a_breakdown_label() -> None:
    assert "operation" in BREAKDOWN_LABELS


@pytest.mark.parametrize("run", sorted(RUNS))
def test_counts_per_operation_are_the_calls(run: str) -> None:
    keys = _observe(run)
    expected = _expected_counts(run)
    assert {op for _, op in expected} >= {"init", "update", "finish", "sleep", "wake"}
    for (family, op), n in expected.items():
        child = f"{family}{{operation={op}}}"
        # the endpoint's own row: the running total, and the interval's mean
        assert keys[f"inference/{run}/{child}_count"] == n, child
        assert f"inference/{run}/{child}:mean" in keys, child
        # fleet scope: the interval's count (the family appeared between the two scrapes: it
        # was created lazily, so all of it is new) and pooled quantiles from bucket deltas
        assert keys[f"inference/agg/{child}/delta"] == n, child
        for q in ("p50", "p90", "p99"):
            assert keys[f"inference/agg/{child}/{q}"] >= 0, (child, q)
        mean = keys[f"inference/agg/{child}:mean/pooled"]
        assert mean == pytest.approx(keys[f"inference/{run}/{child}_sum"] / n)
    # per-operation children sum to what the summed-away family would have said
    total = sum(n for (f, _), n in expected.items() if f == RL)
    ops = [k for k in keys if k.startswith(f"inference/{run}/{RL}{{") and k.endswith("_count")]
    assert sum(keys[k] for k in ops) == total


@pytest.mark.parametrize("run", sorted(RUNS))
def test_rl_families_belong_to_the_endpoint_not_engine_0(run: str) -> None:
    keys = _observe(run)
    engines = {"single": ["single.0"], "dp2": ["dp2.0", "dp2.1"]}[run]
    for e in engines:
        assert f"inference/{e}/generation_tokens_total:rate" in keys
        own = [k for k in keys if k.startswith(f"inference/{e}/")]
        assert not [k for k in own if "rl_weight_update" in k or "sleep_mode_" in k], e
    assert any(k.startswith(f"inference/{run}/{RL}{{operation=") for k in keys)
    assert any(k.startswith(f"inference/{run}/{SLEEP}{{operation=") for k in keys)
    # engine_sleep_state has an engine label: it stays per engine
    for e in engines:
        assert keys[f"inference/{e}/engine_sleep_state{{sleep_state=awake}}"] == 1.0


def test_policy_versions_are_ordered_by_first_announcement() -> None:
    from fleetscope.rl.versions import PolicyVersions

    v = PolicyVersions(stale_seconds=10.0)
    assert not v.active and v.policy_version is None
    assert v.announce("b", now=0.0) == 0
    assert v.announce("a", now=1.0) == 1  # opaque strings: not sorted, ordered as announced
    v.served.update({"s0": "b", "s1": "a", "s2": "default"})
    assert [v.served_index(e) for e in ("s0", "s1", "s2", "s3")] == [0, 1, None, None]
    assert v.announce("b", now=2.0) == 0  # a rollback makes an earlier version current again
    assert v.announced == ["b", "a"] and v.announced_at == [0.0, 1.0]
    with pytest.raises(TypeError):
        v.announce(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("run", sorted(RUNS))
def test_per_endpoint_calls_seconds_and_quantiles_per_operation(run: str) -> None:
    """Per endpoint and operation, every poll: the calls and seconds between the two scrapes
    and p50/p90/p99 by PromQL's rules over the bucket increases, all read independently from
    the recorded bodies' text; the fleet's exact seconds per operation too."""
    keys = _observe(run, operations=True)
    before, after = ((DATA / run / f"{n}.prom").read_text() for n in RUNS[run])
    expected = _expected_counts(run)
    for (family, op), n in expected.items():
        child = f"{family}{{operation={op}}}"
        head = f"inference/{run}/{child}"
        label = f'operation="{op}"'
        count = _from_text(before, after, f"vllm:{family}_count{{{label}}}")
        seconds = _from_text(before, after, f"vllm:{family}_sum{{{label}}}")
        assert keys[f"{head}/delta"] == count == n, child
        assert keys[f"{head}_sum/delta"] == seconds, child
        assert keys[f"inference/agg/{child}_sum/delta"] == seconds, child
        now = bucket_values(after, f"vllm:{family}", label)
        was = dict(bucket_values(before, f"vllm:{family}", label)) if label in before else {}
        increase = [(le, c - was.get(le, 0.0)) for le, c in now]
        for q in (0.5, 0.9, 0.99):
            want = promql_bucket_quantile(q, increase)
            assert keys[f"{head}/p{round(q * 100)}"] == pytest.approx(want, rel=1e-12), (child, q)
    # never under an engine
    assert not [k for k in keys if k.startswith(f"inference/{run}.") and "_sum/delta" in k]


async def test_per_endpoint_operations_in_windows_and_the_run_summary() -> None:
    """A window over weight updates on three endpoints (two roles): per endpoint and
    operation the window and the run summary hold the calls and seconds the simulator
    recorded, the in-flight gauge's time-weighted mean and peak; per role the exact seconds.
    Updates before the window are in the summary only."""
    import asyncio

    from fleetscope.collector.core import Collector
    from fleetscope.sources.http.source import Endpoint
    from fleetscope_sim import FleetServer, SimFleet

    roles: dict[str, Role] = {"server0": "decode", "server1": "decode", "server2": "prefill"}
    fleet = SimFleet(seed=3)
    for name, role in roles.items():
        fleet.add_endpoint(dp=2 if name == "server1" else 1, name=name, role=role)
    fleet.step(2.0)
    server = FleetServer(fleet).start()
    eps = [Endpoint(server.url(n), name=n, role=r) for n, r in roles.items()]
    c = Collector(eps, interval=3600, timeout=5.0, fetch_model_info=False, discover_roles=False)
    before = {"server0": 0.125}  # observed before the window: summary only
    inside = {"server0": [0.25, 2.0], "server1": [0.5], "server2": [0.75, 0.05]}
    try:
        await c.poll()  # baselines
        fleet.endpoint("server0").simulate_weight_update(None, {"update": before["server0"]})
        fleet.step(1.0)
        await c.poll()
        w = c.window("train")
        await w.astart()
        for name, secs in inside.items():
            for s in secs:
                fleet.endpoint(name).simulate_weight_update(None, {"update": s})
            fleet.endpoint(name).rl.set_in_flight("update", 1)
        fleet.step(1.0)
        await asyncio.sleep(0.01)
        await c.poll()
        for name in inside:
            fleet.endpoint(name).rl.set_in_flight("update", 0)
        fleet.step(1.0)
        await asyncio.sleep(0.01)
        await c.poll()
        keys = await w.astop()
        summary = c.summary()
    finally:
        await c.stop()
        server.stop()
    child = f"{RL}{{operation=update}}"
    gauge = "rl_weight_update_operations_in_flight{operation=update}"
    for name, secs in inside.items():
        head = f"inference/train/{name}/{child}"
        assert keys[f"{head}/delta"] == len(secs), name
        assert keys[f"{head}_sum/delta"] == pytest.approx(sum(secs), rel=1e-12), name
        assert keys[f"{head}/p99"] > 0
        assert keys[f"inference/train/{name}/{gauge}/peak"] == 1.0
        assert 0.0 < keys[f"inference/train/{name}/{gauge}/mean"] < 1.0  # up for part of it
        run = f"inference_summary/combined/{name}/{child}"
        assert summary[f"{run}/delta"] == len(secs) + int(name in before)
        assert summary[f"{run}_sum/delta"] == pytest.approx(
            sum(secs) + before.get(name, 0.0), rel=1e-12
        )
    for role in ("decode", "prefill"):
        want = sum(sum(s) for n, s in inside.items() if roles[n] == role)
        got = keys[f"inference/train/{role}/{child}_sum/delta"]
        assert got == pytest.approx(want, rel=1e-12)
    # the 2 s call is in server0's p99 bucket range, the 0.25 s call in its p50's
    assert (
        keys[f"inference/train/server0/{child}/p50"]
        <= 1.0
        < keys[f"inference/train/server0/{child}/p99"]
    )
