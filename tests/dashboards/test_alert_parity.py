"""Parity: one simulated fleet, watched at once by a real Prometheus evaluating the rules
``fleetscope alerts`` writes and by fleetscope's own collector (its HealthMonitor and RL
states), raises the same conditions for the same engines.

The fleet (vLLM and SGLang, prefill and decode roles, simulated in real time): a KV-starved
colocated engine (KV near full, a growing queue, preemption bursts, from the start); at a moment
T0 when both watchers have data, a vLLM and an SGLang decode engine stall, a vLLM decode engine
slows down 40x, an idle engine falls asleep and an idle server answers 500. A stalled prefill
engine of each kind must raise nothing (prefill engines are not judged). Prometheus scrapes and
evaluates every 0.5 s, the collector polls every 0.5 s, with the same thresholds.

The test waits on events (Prometheus' ``/api/v1/alerts`` and the collector's polls, until every
expected condition is reported by both, then a short grace for late extras) under a generous
deadline. Conditions injected at T0 must fire on both sides within a few scrape intervals of
each other: Prometheus' ``for:`` starts one evaluation after the scrape that shows the
condition, and scrapes, polls and evaluations are not aligned (docs/alerts.md).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from fleetscope.collector.core import Collector, FleetView
from fleetscope.dashboards.alerts import ALERTS, AlertOptions, rules_yaml
from fleetscope.health import HealthThresholds
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, LoadProfile, SimFleet
from support.loads import KV_PRESSURE_LOAD
from support.prom import PrometheusServer

pytestmark = pytest.mark.slow

INTERVAL = 0.5  # Prometheus' scrapes and evaluations, the collector's polls
DEADLINE_S = 60.0  # a bound for a loaded machine, not an expected time
GRACE_S = 2.0  # after everything expected was seen: room for late extras on either side
MAX_LAG_S = 3.0  # the same condition, injected at T0, fires this close on both sides
THRESHOLDS = HealthThresholds(
    stall_seconds=3.0,
    kv_seconds=1.0,
    queue_seconds=1.5,
    queue_polls=3,
    preemption_burst=4.0,
    outlier_seconds=4.0,
    paused_seconds=2.0,
)
#: alert -> the HealthMonitor condition it stands for
CONDITION = {name: doc.condition for name, doc in ALERTS.items()}
Seen = dict[tuple[str, str], float]  # (condition, engine id or endpoint) -> first seen

#: SGLang's servers: neither watcher is told their role, engine_type says it
SGLANG = ("decode3", "prefill1")
#: injected at T0: they must fire on both sides, close in time
INJECTED = {
    ("generation_stalled", "decode0.0"),  # vLLM
    ("generation_stalled", "decode3.1"),  # SGLang, its replica 1
    ("engine_outlier", "decode1.0"),  # vLLM, 40x slower
    ("engine_outlier", "decode0.0"),  # a stalled engine is far below its role's median too
    ("engine_outlier", "decode3.1"),
    ("engine_paused", "server1.0"),  # asleep
    ("scrape_failed", "server2"),  # HTTP 500
}
#: from the start (KV pressure): they must fire on both sides
STARVED = {
    ("kv_cache_near_full", "server0.0"),
    ("queue_growing", "server0.0"),
    ("preemption_burst", "server0.0"),
}


def build_fleet() -> SimFleet:
    """Endpoints in this order (names per role): prefill0 (vLLM, DP 2), decode0, decode1,
    decode2 (vLLM, DP 2), decode3 (SGLang, DP 2), prefill1 (SGLang), server0 (vLLM, KV
    pressure), server1 and server2 (vLLM, idle)."""
    fleet = SimFleet(seed=7)
    busy = LoadProfile(arrival_rate=8.0)
    fleet.add_endpoint(role="prefill", dp=2)
    for _ in range(3):
        fleet.add_endpoint(role="decode", dp=2, load=busy)
    fleet.add_endpoint(role="decode", dp=2, load=busy, engine_kind="sglang")
    fleet.add_endpoint(role="prefill", dp=1, engine_kind="sglang")
    starved = dataclasses.replace(LoadProfile(**KV_PRESSURE_LOAD), arrival_rate=12.0)
    fleet.add_endpoint(dp=1, load=starved)
    fleet.add_endpoint(dp=1, load=LoadProfile(arrival_rate=0.0))
    fleet.add_endpoint(dp=1, load=LoadProfile(arrival_rate=0.0))
    fleet.step(3.0)  # requests running everywhere busy
    return fleet


def inject(fleet: SimFleet) -> None:
    """The faults of T0. An engine that stalls or slows down gets no new requests (its queue
    would grow too, by chance from one scrape to the next: not what this test is about)."""
    for name, engine in (("decode0", 0), ("decode3", 1), ("prefill0", 1), ("prefill1", 0)):
        fleet.endpoint(name).set_arrival_rate(0.0, engine=engine)
        fleet.endpoint(name).stall(engine=engine)
    fleet.endpoint("decode1").set_arrival_rate(0.0, engine=0)
    fleet.endpoint("decode1").set_slowdown(40.0, engine=0)
    fleet.endpoint("server1").sleep(1)
    fleet.endpoint("server2").set_http_error(500)


class FleetscopeSide:
    """What the collector reported: each (condition, subject) and when it was first seen."""

    def __init__(self) -> None:
        self.seen: Seen = {}
        self.polls = 0
        self._lock = threading.Lock()

    def on_poll(self, view: FleetView) -> None:
        now = time.time()
        with self._lock:
            self.polls += 1
            for e in view.result.events:
                self.seen.setdefault((e.condition, e.subject), now)

    def snapshot(self) -> tuple[int, Seen]:
        with self._lock:
            return self.polls, dict(self.seen)


def firing(prom: PrometheusServer, names: dict[str, str], seen: Seen) -> None:
    """Add the firing alerts (as fleetscope names the subject) to ``seen``."""
    now = time.time()
    for alert in prom.alerts():
        if alert["state"] != "firing":
            continue
        labels = alert["labels"]
        endpoint = names[labels["instance"]]
        subject = f"{endpoint}.{labels['engine']}" if "engine" in labels else endpoint
        seen.setdefault((CONDITION[labels["alertname"]], subject), now)


@contextmanager
def watched(
    fleet: SimFleet, rules: Path
) -> Iterator[tuple[FleetServer, PrometheusServer, Collector, FleetscopeSide, dict[str, str]]]:
    with ExitStack() as stack:
        server = stack.enter_context(FleetServer(fleet, step_interval=0.25))
        targets = [url.removeprefix("http://") for url in server.urls]
        names = {t: ep.name for t, ep in zip(targets, fleet.endpoints, strict=True)}
        roles = {
            t: {"role": str(ep.role)}
            for t, ep in zip(targets, fleet.endpoints, strict=True)
            if ep.role is not None and ep.name not in SGLANG
        }
        prom = stack.enter_context(
            PrometheusServer(
                targets,
                scrape_interval=INTERVAL,
                target_labels=roles,
                rule_files=[rules],
                evaluation_interval=INTERVAL,
            )
        )
        fleetscope = FleetscopeSide()
        endpoints = [
            Endpoint(server.url(ep.name), ep.name, None if ep.name in SGLANG else ep.role)
            for ep in fleet.endpoints
        ]
        collector = Collector(
            endpoints,
            interval=INTERVAL,
            timeout=2.0,
            fetch_model_info=False,
            discover_roles=False,
            health_thresholds=THRESHOLDS,
            on_poll=fleetscope.on_poll,
            isolation="inline",
        )
        collector.start_background()
        stack.callback(collector.stop_background, 60.0)
        yield server, prom, collector, fleetscope, names


def test_prometheus_and_fleetscope_fire_the_same_conditions(tmp_path: Path) -> None:
    rules = tmp_path / "fleetscope-rules.yml"
    rules.write_text(
        rules_yaml(AlertOptions(thresholds=THRESHOLDS, scrape_interval=INTERVAL)),
        encoding="utf-8",
    )
    fleet = build_fleet()
    prom_seen: Seen = {}
    with watched(fleet, rules) as (_, prom, _, fleetscope, names):
        # both have data on the healthy fleet before T0
        start = time.time()
        prom.wait_for_scrape_after(start + INTERVAL, timeout=DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while fleetscope.snapshot()[0] < 3:
            assert time.monotonic() < deadline, "the collector did not poll"
            firing(prom, names, prom_seen)
            time.sleep(0.1)
        t0 = time.time()
        inject(fleet)
        expected = INJECTED | STARVED
        done_at: float | None = None
        while True:
            firing(prom, names, prom_seen)
            _, fleet_seen = fleetscope.snapshot()
            if done_at is None and expected <= set(prom_seen) and expected <= set(fleet_seen):
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at >= GRACE_S:
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        _, fleet_seen = fleetscope.snapshot()

    report = "\n".join(
        f"  {c:<20} {s:<10} prometheus {_at(prom_seen, (c, s), t0)}  "
        f"fleetscope {_at(fleet_seen, (c, s), t0)}"
        for c, s in sorted(set(prom_seen) | set(fleet_seen))
    )
    print(report)
    assert expected <= set(fleet_seen), f"fleetscope missed some:\n{report}"
    assert expected <= set(prom_seen), f"Prometheus missed some:\n{report}"
    assert set(prom_seen) == set(fleet_seen), f"not the same conditions:\n{report}"
    for key in INJECTED:  # the same fault, seen at about the same time
        assert abs(prom_seen[key] - fleet_seen[key]) <= MAX_LAG_S, f"{key}:\n{report}"
    assert time.time() - start < DEADLINE_S


def _at(seen: Seen, key: tuple[str, str], t0: float) -> str:
    return f"{seen[key] - t0:+6.2f}s" if key in seen else "   -   "
