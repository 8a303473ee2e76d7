"""Clamped tails over real HTTP: when a pooled quantile's rank falls in the ``+Inf`` bucket,
PromQL's rule returns the highest finite bound, a floor of the true value (long RL generations
hit it on vLLM's e2e and decode-time histograms). A flag beside the figure says so, in the
per-poll row, the window and the run summary (docs/rules.md §3 item 5)."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest

from fleetscope import Collector
from fleetscope.sinks.terminal import TerminalSink, engine_rows, poll_line
from support.loopback import LoopbackServer
from support.paths import VLLM_DIR

BODY = (VLLM_DIR / "single_load.prom").read_text(encoding="utf-8")
E2E = "vllm:e2e_request_latency_seconds"
TOP = 7680.0  # the highest finite bound of vLLM 0.32's e2e latency buckets


def observed(n: int, at: float, family: str = E2E, body: str = BODY) -> str:
    """The body with ``n`` more observations of ``at`` seconds in ``family`` than it has."""

    def bump(m: re.Match[str]) -> str:
        le = re.search(r'le="([^"]+)"', m[1])
        grows = m[2] in ("_count", "_sum") or (le is not None and float(le[1]) >= at)
        add = n * at if m[2] == "_sum" else n
        return f"{m[1]} {float(m[3]) + (add if grows else 0)}"

    pattern = rf"^({family}(_bucket|_count|_sum)\{{[^}}]*\}}) (\S+)$"
    out, k = re.subn(pattern, bump, body, flags=re.M)
    assert k > 3
    return out


@pytest.mark.parametrize(("at", "clamped"), [(9000.0, True), (3.0, False)])
async def test_a_quantile_in_the_inf_bucket_is_flagged(at: float, clamped: bool) -> None:
    base = "inference/agg/e2e_request_latency_seconds/"
    with LoopbackServer({"/metrics": observed(0, at)}) as server:
        c = Collector([server.url], interval=3600, fetch_model_info=False, timeout=30)
        await c.poll()
        w = c.window("train")
        await w.astart()
        server.routes["/metrics"] = observed(10, at)
        row = (await c.poll()).keys
        server.routes["/metrics"] = observed(20, at)
        window = await w.astop()
        summary: dict[str, Any] = dict(c.summary())
        await c.stop()
    scopes = {
        "row": (row, base),
        "window": (window, "inference/train/agg/e2e_request_latency_seconds/"),
        "summary": (summary, "inference_summary/train/agg/e2e_request_latency_seconds/"),
    }
    for where, (keys, prefix) in scopes.items():
        for q in ("p50", "p90", "p99"):
            value = keys[prefix + q]
            if clamped:  # the floor PromQL returns, and the flag beside it
                assert value == TOP and keys[prefix + q + "_clamped"] == 1.0, (where, q)
            else:
                assert value < TOP and prefix + q + "_clamped" not in keys, (where, q)


async def test_the_terminal_says_a_clamped_figure_is_a_floor() -> None:
    """The live view's header and the piped line put ``≥`` before a clamped quantile."""
    ttft = "vllm:time_to_first_token_seconds"
    slow = observed(10, 3000.0, ttft)  # beyond 2560 s, the last finite TTFT bound
    with LoopbackServer({"/metrics": BODY}) as server:
        c = Collector([server.url], interval=3600, fetch_model_info=False, timeout=30)
        await c.poll()
        server.routes["/metrics"] = slow
        result = (await c.poll()).result
        await c.stop()
    line = poll_line("fleetscope", result, engine_rows(result, {}))
    assert "TTFT p50 ≥2560 p99 ≥2560 s" in line, line
    sink = TerminalSink(file=io.StringIO(), live=False, compact=False)
    sink.console.width = 200
    sink.log_poll(result)
    assert "TTFT p90 ≥2560 s" in sink.console.file.getvalue()  # type: ignore[attr-defined]
