"""Small bodies are parsed on the event loop a slice at a time (sources/_loop_parse.py): a
burst of answers never holds one loop iteration for more than about one slice, errors reach
their own scrape, and a cancelled scrape's job is skipped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from fleetscope.sources.http.loop_parse import SLICE, LoopParser


async def test_a_burst_of_parses_yields_to_the_loop_between_slices() -> None:
    lp = LoopParser()
    iteration = 0
    stop = False

    async def other_work() -> None:  # the trainer's callbacks: one step per loop iteration
        nonlocal iteration
        while not stop:
            iteration += 1
            await asyncio.sleep(0)

    seen: list[int] = []

    def job(i: int) -> Callable[[], int]:
        def run() -> int:
            seen.append(iteration)
            time.sleep(0.001)  # each parse takes at least 1 ms
            return i

        return run

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    jobs = 60
    got = await asyncio.gather(*(lp.run(job(i)) for i in range(jobs)))
    stop = True
    await other
    assert got == list(range(jobs))  # every result to its own caller, in order
    # at most SLICE / 1 ms + 1 jobs per iteration; a loaded machine only makes it fewer
    per_iteration = max(seen.count(v) for v in set(seen))
    assert per_iteration <= int(SLICE / 0.001) + 1
    assert len(set(seen)) >= jobs // (int(SLICE / 0.001) + 1)


async def test_an_error_reaches_its_own_caller_only() -> None:
    lp = LoopParser()

    def bad() -> int:
        raise ValueError("bad exposition")

    results = await asyncio.gather(
        lp.run(lambda: 1), lp.run(bad), lp.run(lambda: 3), return_exceptions=True
    )
    assert results[0] == 1 and results[2] == 3
    assert isinstance(results[1], ValueError)


async def test_a_cancelled_scrape_is_not_parsed() -> None:
    lp = LoopParser()
    ran: list[str] = []
    first = asyncio.ensure_future(lp.run(lambda: ran.append("first")))
    second = asyncio.ensure_future(lp.run(lambda: ran.append("second")))
    await asyncio.sleep(0)  # both queued
    second.cancel()
    await first
    with pytest.raises(asyncio.CancelledError):
        await second
    await asyncio.sleep(0)
    assert ran == ["first"]


def test_a_new_event_loop_gets_its_own_drain_task() -> None:
    lp = LoopParser()
    assert asyncio.run(lp.run(lambda: 1)) == 1
    assert asyncio.run(lp.run(lambda: 2)) == 2  # the first loop is closed
