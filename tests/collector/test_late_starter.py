"""A late starter and a window, over real HTTP: an endpoint refused (503) at first, whose
process started 1.6 s before a window opened and was first scraped after it. Its start time
proves it counted from 0, so the run counts everything (rules §3 item 3); but those counts
cannot be placed in time: they were credited to the window with coverage 1.0. They are not
the window's: the window leaves them out and says that engine's time was not seen
(docs/bad-data.md §7)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from fleetscope import Collector
from fleetscope.sources.http.source import Endpoint
from fleetscope_sim import FleetServer, SimEndpoint, SimFleet
from support.loopback import LoopbackServer, Reply
from support.paths import VLLM_DIR
from support.simclock import keep_clock_ahead

BODY = (VLLM_DIR / "single_load.prom").read_text(encoding="utf-8")
GEN = "vllm:generation_tokens_total"
KEY = "generation_tokens_total"


def started_at(start: float, generated: float) -> str:
    """The capture as a process that started at ``start`` (wall clock) would expose it."""
    body = re.sub(r"^(process_start_time_seconds) \S+$", rf"\g<1> {start!r}", BODY, flags=re.M)
    body = re.sub(r"^(\S+_created(\{[^}]*\})?) \S+$", rf"\g<1> {start!r}", body, flags=re.M)
    return re.sub(rf"^({GEN}\{{[^}}]*\}}) \S+$", rf"\g<1> {generated!r}", body, flags=re.M)


async def test_counts_from_before_a_window_are_not_the_windows() -> None:
    with LoopbackServer({"/metrics": Reply(b"starting", status=503)}) as server:
        c = Collector([server.url], interval=3600, fetch_model_info=False, timeout=30)
        await c.poll()  # its first attempt: refused, as a starting vLLM is
        first_attempt = time.time()
        # the process starts well after that attempt (beyond the 1 s clock-skew allowance)
        # and 1.6 s before the window opens
        await asyncio.sleep(2.8)
        start = time.time() - 1.6
        assert start > first_attempt + 1.0
        w = c.window("train")
        await w.astart()  # still refused: the window opens without it
        server.routes["/metrics"] = started_at(start, 1789.0)
        await c.poll()  # first scraped inside the window: counted from 0, for the run
        server.routes["/metrics"] = started_at(start, 1800.0)
        keys = await w.astop()
        summary = dict(c.summary())
        await c.stop()
    gen = "agg/generation_tokens_total/delta"
    assert summary[f"inference_summary/combined/{gen}"] == 1800.0  # the run: everything
    assert keys[f"inference/train/{gen}"] == 11.0  # the window: what it saw happen
    assert keys["inference/train/coverage"] < 1.0


async def late_server_in_a_window(
    *, refused: int, starts_late: bool
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """A window; a server (single-process: its start time is exposed) added inside it,
    refused (503) for ``refused`` polls, slowly: each refusal is its poll's last scrape. Then
    it answers: its process restarted after our last poll (``starts_late``: counted from 0),
    or it ran all along (its first answer is a baseline).
    Returns the window's keys, the run summary, and the window's true generated tokens."""
    fleet = SimFleet(seed=2, wall_start=time.time(), record_observations=False)
    fleet.add_endpoint(dp=1)
    late = fleet.add_endpoint(dp=1, name="late")
    late.set_http_error(503)
    late.set_slow(0.3)
    fleet.step(2.0)

    def generated(ep: SimEndpoint) -> float:
        return sum(e.truth.counter(GEN) for e in ep.engines)

    with FleetServer(fleet) as server:
        c = Collector(server.urls[:1], interval=3600, timeout=5.0, fetch_model_info=False)
        try:
            await c.poll()
            w = c.window("eval")
            await w.astart()
            g0 = generated(fleet.endpoint("server0"))
            c.add_endpoints(Endpoint(server.urls[1], name="late"))
            for _ in range(refused):
                fleet.step(1.0)
                await c.poll()  # refused: its first try, then tries that never answered
            if starts_late:
                keep_clock_ahead(fleet)  # dated after our last poll, however long it took
                late.restart()
            late.clear_faults()
            l0 = generated(late)
            fleet.step(1.0)
            await c.poll()  # its first answer: counted from 0, or a baseline
            if not starts_late:
                l0 = generated(late)
            fleet.step(1.0)
            keys = await w.astop()
            summary = dict(c.summary())
            want = generated(fleet.endpoint("server0")) - g0 + generated(late) - l0
        finally:
            await c.stop()
    return keys, summary, want


@pytest.mark.parametrize("refused", [1, 3])
async def test_a_late_starter_refused_inside_a_window_is_the_windows(refused: int) -> None:
    """A server that joins inside a window, refused until its process starts (after our
    poll: its start time says so), counted from 0: nothing was unobservable, the window and
    the run are whole (rules §3.10). Its first counts were left out of the window (its
    refusal, the poll's last scrape, dated the window's expectation of it after the poll its
    first interval begins at), and its refused polls cost coverage as an endpoint that never
    answered (its first answer proves nothing ran unseen)."""
    keys, summary, want = await late_server_in_a_window(refused=refused, starts_late=True)
    assert keys[f"inference/eval/agg/{KEY}/delta"] == want
    assert keys["inference/eval/coverage"] == 1.0
    assert summary["inference_summary/combined/coverage"] == 1.0


async def test_a_server_refused_then_answering_with_an_old_process_costs_coverage() -> None:
    """The same, but its process ran all along: its first answer is a baseline, and what it
    did while refused was not seen: the window and the run say so (docs/bad-data.md §7)."""
    keys, summary, want = await late_server_in_a_window(refused=3, starts_late=False)
    assert keys[f"inference/eval/agg/{KEY}/delta"] == want
    assert keys["inference/eval/coverage"] < 1.0
    assert summary["inference_summary/combined/coverage"] < 1.0
