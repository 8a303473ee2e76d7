"""A server without a start time (vLLM's DP / multiprocess bodies) restarted between two scrapes
and grew past its old values: its body cannot show the restart, so the figures must say they
cannot vouch for that interval (docs/bad-data.md, "Continuity without a start time").

Over the real HTTP stack: the simulated fleet's server drops the old process' connections at a
restart, as a real one does; the collector learns how long the server lets a connection idle,
and a connection closed sooner than that is evidence. A failed scrape of any kind in between is
evidence too; a restart seen on one engine of a DP server is evidence for its other engines.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from fleetscope import Collector, Endpoint
from fleetscope_sim import FleetServer, SimEndpoint, SimFleet
from support.simclock import ahead_fleet

GEN = "vllm:generation_tokens_total"
TOTAL = "inference_summary/combined/agg/generation_tokens_total/delta"
COVERAGE = "inference_summary/combined/coverage"
# long enough that an early close stands out from any idle timeout (continuity.DROP_MARGIN)
KEPT_IDLE = 1.5


def dp_fleet(dp: int = 2, mode: str | None = None) -> tuple[SimFleet, SimEndpoint]:
    fleet = ahead_fleet(seed=7)
    ep = fleet.add_endpoint(role="decode", dp=dp, mode=mode)  # type: ignore[arg-type]
    fleet.step(4.0)
    return fleet, ep


def collector(server: FleetServer, ep: SimEndpoint) -> Collector:
    return Collector(
        [Endpoint(server.url(ep.name), ep.name)],
        interval=3600,
        timeout=30,
        fetch_model_info=False,
    )


async def run_restarts(
    restarts: int, caplog: pytest.LogCaptureFixture
) -> tuple[float, float, float]:
    """(truth, counted, run coverage) over: a baseline, a poll after the server kept the
    connection ``KEPT_IDLE`` s, then ``restarts`` times: restart, grow, poll. The last restart
    grows the young process past its predecessor's values; the first one shows (counters
    dropped)."""
    fleet, ep = dp_fleet()
    with FleetServer(fleet) as server, caplog.at_level(logging.WARNING, "fleetscope"):
        c = collector(server, ep)
        await c.poll()
        t0 = ep.truth_total(GEN)
        await asyncio.sleep(KEPT_IDLE)  # the server keeps an idle connection this long
        fleet.step(1.0)
        await c.poll()
        for k in range(restarts):
            fleet.step(0.5)
            ep.restart()
            fleet.step(0.5 if k < restarts - 1 else 30.0)  # the last grows past the old values
            await c.poll()
            fleet.step(1.0)
            await c.poll()
        truth = ep.truth_total(GEN) - t0
        summary = c.summary()
        await c.stop()
    total, coverage = summary[TOTAL], summary[COVERAGE]
    assert isinstance(total, float) and isinstance(coverage, float)
    return truth, total, coverage


@pytest.mark.usefixtures("isolation")  # and with the collector's work in a child process
async def test_a_dp_server_restarted_twice_then_grown_past_lowers_coverage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's case: the second restart leaves nothing in the body (every counter of the
    young process grew past its predecessor's), so the count is short; the collector saw the
    server close the kept connection sooner than it ever had, and says so."""
    truth, counted, coverage = await run_restarts(2, caplog)
    assert counted < truth  # the old processes' tails cannot be recovered
    assert coverage < 1.0
    assert "closed our connection after" in caplog.text
    assert "a restart cannot be ruled out" in caplog.text


@pytest.mark.usefixtures("isolation")
async def test_without_a_restart_the_kept_connection_costs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    truth, counted, coverage = await run_restarts(0, caplog)
    assert counted == truth
    assert coverage == 1.0
    assert "ruled out" not in caplog.text


@pytest.mark.parametrize(
    ("mode", "doubted"),
    [("multiprocess", True), ("single", False)],
    ids=["no-start-time", "start-time"],
)
async def test_a_failed_scrape_in_between_is_evidence_only_without_a_start_time(
    mode: str, doubted: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """An HTTP 503 (not a refusal) between two successes: an engine without a start time cannot
    be vouched for over that interval; one whose start time stayed put can, and is exact."""
    fleet, ep = dp_fleet(mode=mode)
    with FleetServer(fleet) as server, caplog.at_level(logging.WARNING, "fleetscope"):
        c = collector(server, ep)
        await c.poll()
        t0 = ep.truth_total(GEN)
        fleet.step(1.0)
        await c.poll()
        ep.faults.http_status = 503
        fleet.step(1.0)
        await c.poll()
        ep.faults.http_status = None
        fleet.step(1.0)
        view = await c.poll()
        summary = c.summary()
        await c.stop()
    assert summary[TOTAL] == ep.truth_total(GEN) - t0  # no restart: every count seen
    engines = [d for e, d in view.result.deltas.items() if e.is_engine]
    assert len(engines) == 2
    assert all(d.continuity_unknown is doubted for d in engines)
    assert (float(summary[COVERAGE]) < 1.0) is doubted
    why = "was not there to answer a scrape since its last success (HTTP 503)"
    assert (why in caplog.text) is doubted


async def test_a_restart_seen_on_one_engine_of_a_dp_server_doubts_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One engine's counters dropped; the other's (same server process, no start time) grew:
    its interval cannot be vouched for either."""
    fleet, ep = dp_fleet()
    with FleetServer(fleet) as server, caplog.at_level(logging.WARNING, "fleetscope"):
        c = collector(server, ep)
        await c.poll()
        fleet.step(1.0)
        await c.poll()
        ep.restart_engine(0)
        fleet.step(1.0)
        view = await c.poll()
        summary = c.summary()
        await c.stop()
    deltas = {e.label: d for e, d in view.result.deltas.items() if e.is_engine}
    assert deltas["0"].restarted and not deltas["0"].continuity_unknown
    assert deltas["1"].continuity_unknown and not deltas["1"].restarted
    assert deltas["1"].observed_seconds == 0.0
    assert float(summary[COVERAGE]) < 1.0
    assert "showed a restart on another of its rows" in caplog.text
