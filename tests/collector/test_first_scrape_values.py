"""A counter invalid (NaN, +Inf, negative) on its engine's first scrape, valid afterwards, over
real HTTP (a loopback server serving a real vLLM 0.32 body): the run's total lost every later
valid increase (None) with coverage 1.0. The total keeps every increase the rows showed, and
coverage says that the first interval of that series was not observed (docs/bad-data.md §7)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleetscope import Collector
from support.loopback import LoopbackServer
from support.paths import VLLM_DIR

BODY = (VLLM_DIR / "single_load.prom").read_text(encoding="utf-8")
GEN = re.compile(r"^(vllm:generation_tokens_total\{[^}]*\}) \S+$", re.M)
ROW = "inference/agg/generation_tokens_total/delta"
TOTAL = "inference_summary/combined/agg/generation_tokens_total/delta"


def body(generated: str) -> str:
    out, n = GEN.subn(lambda m: f"{m[1]} {generated}", BODY)
    assert n == 1
    return out


async def run(first: str) -> tuple[list[float | None], dict[str, Any]]:
    values = [first, "100", "150", "300", "310"]
    with LoopbackServer({"/metrics": body(first)}) as server:
        c = Collector([server.url], interval=3600, fetch_model_info=False, timeout=30)
        rows: list[float | None] = []
        for v in values:
            server.routes["/metrics"] = body(v)
            view = await c.poll()
            rows.append(view.keys.get(ROW))
        summary: dict[str, Any] = dict(c.summary())
        await c.stop()
    return rows, summary


@pytest.mark.parametrize("first", ["NaN", "+Inf", "-5"])
async def test_a_counter_invalid_on_its_first_scrape(first: str) -> None:
    rows, summary = await run(first)
    assert rows == [None, None, 50.0, 150.0, 10.0]  # unknown until it has a valid baseline
    assert summary[TOTAL] == 210.0  # every increase the rows showed
    assert summary["inference_summary/combined/coverage"] < 1.0  # 0 -> 100 was not seen


async def test_a_valid_first_scrape_is_whole() -> None:
    rows, summary = await run("50")
    assert rows == [None, 50.0, 50.0, 150.0, 10.0]
    assert summary[TOTAL] == 260.0
    assert summary["inference_summary/combined/coverage"] == 1.0
