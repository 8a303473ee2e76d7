"""PrometheusSource against a hostile Prometheus HTTP API (a loopback server answering as one):
malformed answers, a trickling server, an oversized answer, a target up with no series. The
source never raises, bounds a whole poll by its ``timeout``, and every warning names it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleetscope.sources.prometheus import PrometheusSource
from support.loopback import LoopbackServer, Reply, Request

BODY = """# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 10
"""
NOW = 1_700_000_000.0


def vector(entries: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": entries}}
    ).encode()


def metadata() -> bytes:
    return json.dumps(
        {"status": "success", "data": {"vllm:generation_tokens": [{"type": "counter"}]}}
    ).encode()


def api(*, stamps: list[dict[str, Any]] | None = None, samples: bool = True) -> dict[str, Any]:
    """Routes of a small Prometheus: one target ``t:1``, up, scraped at NOW."""
    target = {"instance": "t:1", "job": "vllm"}
    good_stamps = [{"metric": target, "value": [NOW, str(NOW)]}]

    def query(req: Request) -> bytes:
        q = req.query
        if "timestamp" in q:
            return vector(good_stamps if stamps is None else stamps)
        if "query=up" in q:
            return vector([{"metric": {"__name__": "up", **target}, "value": [NOW, "1"]}])
        rows = [
            {
                "metric": {
                    "__name__": "vllm:generation_tokens_total",
                    "engine": "0",
                    "model_name": "m",
                    **target,
                },
                "value": [NOW, "10"],
            }
        ]
        return vector(rows if samples else [])

    return {"/api/v1/query": query, "/api/v1/metadata": metadata()}


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("fleetscope")]


async def test_a_malformed_answer_is_left_out_with_a_warning_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``timestamp(up)`` entries without ``value`` raised KeyError out of ``poll()``."""
    caplog.set_level(logging.WARNING, logger="fleetscope")
    with LoopbackServer(api(stamps=[{"metric": {"instance": "t:1"}}])) as server:
        src = PrometheusSource(server.url, timeout=10)
        try:
            results = await src.scrape()
        finally:
            await src.aclose()
    assert [r.ok for r in results] == [True]  # the target itself is fine
    text = "\n".join(messages(caplog))
    assert "malformed" in text and server.url in text, text


@pytest.mark.parametrize("answer", [b"not json", b'{"status": "success"}', b"[1, 2]"])
async def test_answers_that_are_not_a_vector_fail_the_poll_with_a_warning(
    answer: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fleetscope")
    routes = api()
    routes["/api/v1/query"] = answer
    with LoopbackServer(routes) as server:
        src = PrometheusSource(server.url, timeout=10)
        try:
            assert await src.scrape() == []
        finally:
            await src.aclose()
    assert any(server.url in m for m in messages(caplog)), messages(caplog)


async def test_timeout_bounds_the_whole_poll_against_a_trickling_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each read got its own ``timeout``: one poll took 53 s with ``timeout=2``."""
    caplog.set_level(logging.WARNING, logger="fleetscope")

    def trickle() -> Iterator[bytes]:
        for _ in range(600):
            yield b" "

    routes = api()
    routes["/api/v1/metadata"] = Reply(trickle(), content_type="application/json", interval=0.05)
    with LoopbackServer(routes) as server:
        src = PrometheusSource(server.url, timeout=1.0)
        t0 = time.monotonic()
        try:
            assert await src.scrape() == []
        finally:
            await src.aclose()
        took = time.monotonic() - t0
    # the whole body would take 30 s; the poll ends at its deadline (plus scheduling slack)
    assert took < 15, took
    assert any("timed out" in m and server.url in m for m in messages(caplog))


async def test_an_oversized_answer_is_refused_as_it_streams(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 300 MiB metadata answer grew RSS by 1.28 GB: answers are capped."""
    caplog.set_level(logging.WARNING, logger="fleetscope")
    sent = [0]

    def endless() -> Iterator[bytes]:
        chunk = b"x" * 65536
        while True:
            sent[0] += len(chunk)
            yield chunk

    routes = api()
    routes["/api/v1/metadata"] = Reply(endless(), content_type="application/json")
    with LoopbackServer(routes) as server:
        src = PrometheusSource(server.url, timeout=30, max_body_bytes=1 << 20)
        try:
            assert await src.scrape() == []
        finally:
            await src.aclose()
    assert any("more than 1048576 bytes" in m for m in messages(caplog)), messages(caplog)
    assert sent[0] < 64 << 20  # stopped reading long before the end (there is none)


async def test_a_target_up_with_no_series_is_a_failed_scrape_that_is_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="fleetscope")
    with LoopbackServer(api(samples=False)) as server:
        src = PrometheusSource(server.url, timeout=10)
        try:
            results = await src.scrape()
        finally:
            await src.aclose()
    assert [r.ok for r in results] == [False]
    assert results[0].error == "no matching series"
    text = "\n".join(messages(caplog))
    assert "t:1" in text and "no series" in text and server.url in text, text
