"""Helpers of the sharded-collector tests: comparing two collectors' keys, polling them over the
same frozen fleet states, and the coverage a window should report when a shard's endpoints
were lost before its stop."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

import pytest

from fleetscope.collector.core import Collector
from fleetscope.fleet.view import FleetView
from fleetscope.identity import endpoint_of

# keys a failed scrape changes for the rest of the run (the collectors failed differently), and
# a window's polls (the one that lost a shard polled more)
FAILURE_COUNTS = ("scrape_failures_total", "/failed_scrapes", "/polls")


def clock_dependent(key: str) -> bool:
    """Keys whose value depends on when the collector's own responses arrived."""
    return (
        ":rate" in key  # rates and their spread (`.../x:rate/cv`)
        or "scrape_latency_seconds" in key
        or "/collector/" in key  # the collector's own poll time, load, shard restarts
        or key.endswith(("/generation_stalled", "/engine_outlier"))
        or key.endswith(("/active_seconds", "/coverage"))
        # the engine-time breakdown: each collector's own scrape intervals (rules §3.13)
        or "/engine_time/" in key
        or key.endswith(("/bottleneck", "/bottleneck_role"))
    )


def compare_keys(
    got: Mapping[str, float],
    want: Mapping[str, float],
    label: str,
    skip: Callable[[str], bool] = clock_dependent,
) -> int:
    """The same keys (the collectors' own apart), the same values for every key ``skip``
    leaves; returns how many values were compared."""
    ours, theirs = ({k for k in d if "/collector/" not in k} for d in (got, want))
    assert ours == theirs, (label, sorted(ours ^ theirs)[:20])
    compared = 0
    for k, v in want.items():
        if skip(k) or "/collector/" in k:
            continue
        assert got[k] == v or (math.isnan(got[k]) and math.isnan(v)), (label, k, got[k], v)
        compared += 1
    return compared


def after_failures(key: str) -> bool:
    """:func:`clock_dependent`, and the failure counts of a collector that lost a shard."""
    return clock_dependent(key) or any(s in key for s in FAILURE_COUNTS)


def counters_only(keys: Mapping[str, float]) -> Callable[[str], bool]:
    """For a window or summary across a loss: :func:`after_failures`, and every gauge
    statistic (time-weighted over each collector's own seconds, and extremes over the
    samples each saw; the totals and histogram quantiles are exact)."""
    gauges = {k[: -len("/peak")] for k in keys if k.endswith("/peak")}

    def skip(key: str) -> bool:
        return after_failures(key) or key.rsplit("/", 1)[0] in gauges

    return skip


async def poll_all(collectors: Mapping[str, Collector]) -> dict[str, FleetView]:
    """Every collector polls once, one after another (all see the same frozen bodies)."""
    return {name: await c.poll() for name, c in collectors.items()}


async def until_all_report(
    collector: Collector, endpoints: int, *, deadline: float = 180.0, pause: float = 0.5
) -> list[FleetView]:
    """Poll until every endpoint reports (generous deadline); returns the polls taken."""
    views: list[FleetView] = []
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        views.append(await collector.poll())
        if views[-1].endpoints_reporting == endpoints:
            return views
        await asyncio.sleep(pause)
    raise AssertionError(
        f"{[v.endpoints_reporting for v in views]} of {endpoints} endpoints after {deadline} s"
    )


def fleetscope_warnings(records: Sequence[logging.LogRecord]) -> list[str]:
    return [
        r.getMessage() for r in records if r.name == "fleetscope" and r.levelno == logging.WARNING
    ]


class WindowCoverage:
    """The coverage a window must report, from the views of its polls (start boundary first,
    stop boundary last): every engine is expected from its scrape at the start to its scrape
    at the stop (the stop's poll time if it failed there) and covered up to its last
    successful scrape."""

    def __init__(self, start: FleetView) -> None:
        engines = [i for i in start.result.inputs if i.is_engine]
        self.start = {i.engine_id: i.delta.current.time for i in engines}
        self.endpoint = {i.engine_id: endpoint_of(i.engine_id) for i in engines}
        self.last_ok: dict[str, float] = {}
        self.stop: FleetView | None = None
        self.add(start)

    def add(self, view: FleetView) -> None:
        for sc in view.result.scrapes:
            if sc.ok:
                self.last_ok[sc.endpoint] = sc.time
        self.stop = view

    def coverage(self) -> float:
        assert self.stop is not None
        at_stop = {sc.endpoint: sc for sc in self.stop.result.scrapes}
        covered = expected = 0.0
        for engine, t0 in self.start.items():
            ep = self.endpoint[engine]
            sc = at_stop[ep]
            end = sc.time if sc.ok else self.stop.result.time
            covered += self.last_ok[ep] - t0
            expected += end - t0
        return covered / expected

    def lost(self) -> list[str]:
        """The endpoints that failed at the stop."""
        assert self.stop is not None
        return [sc.endpoint for sc in self.stop.result.scrapes if not sc.ok]


def assert_coverage(got: float, want: float) -> None:
    assert got < 1.0 and got == pytest.approx(want, rel=1e-9, abs=1e-12), (got, want)
