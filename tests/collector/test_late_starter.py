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

from fleetscope import Collector
from support.loopback import LoopbackServer, Reply
from support.paths import VLLM_DIR

BODY = (VLLM_DIR / "single_load.prom").read_text(encoding="utf-8")
GEN = "vllm:generation_tokens_total"


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
