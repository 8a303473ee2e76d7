"""scripts/real_vllm/loadgen.py reads streamed responses split on ``\\n`` only.

vLLM leaves U+0085, U+2028 and U+2029 raw inside the JSON strings of its ``data:`` lines;
``str.splitlines()`` (which httpx's ``aiter_lines()`` uses) splits on them and cut the line in
two, so the request was counted as failed. Served here from a loopback server, in chunks that
also cut a multi-byte character in half.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from types import ModuleType

import httpx
import pytest

from support.loopback import LoopbackServer, Reply, Request
from support.paths import ROOT

SCRIPTS = ROOT / "scripts" / "real_vllm"

NASTY = (
    "a\u0085b\u2028c\u2029d\x1ce\x1df\x1eg\x0bh\x0ci"  # every str.splitlines() separator but \r\n
)


def sse_body() -> bytes:
    events = [
        {"choices": [{"index": 0, "text": NASTY, "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "é" + NASTY, "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 9}},
    ]
    lines = [f"data: {json.dumps(e, ensure_ascii=False)}\r\n\r\n" for e in events]
    return ("".join(lines) + "data: [DONE]\n\n").encode("utf-8")


def stream(request: Request) -> Reply:
    """The SSE body in 7-byte chunks: some cut "é" and U+2028 in half."""
    body = sse_body()
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]
    return Reply(chunks, content_type="text/event-stream", chunked=True)


@pytest.fixture
def loadgen() -> Iterator[ModuleType]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("loadgen")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture
def server_url() -> Iterator[str]:
    with LoopbackServer(default=stream, protocol="HTTP/1.1") as server:
        yield server.url


def test_streamed_json_with_unicode_line_separators_is_counted(
    loadgen: ModuleType, server_url: str
) -> None:
    req = {"kind": "completion_stream", "text": "hi", "max_tokens": 9, "ignore_eos": True}
    tally = loadgen.Tally()

    async def run() -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            await loadgen.one(client, server_url, req, tally)

    asyncio.run(run())
    assert tally.errors == [] and tally.ok == 1 and tally.failed == 0
    assert (tally.prompt_tokens, tally.completion_tokens) == (17, 9)
    assert tally.finish_reasons == {"length": 1}


def test_sse_lines_splits_on_newline_only(loadgen: ModuleType) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        body = sse_body()
        for i in range(0, len(body), 3):
            yield body[i : i + 3]

    async def collect() -> list[str]:
        return [line async for line in loadgen.sse_lines(chunks())]

    lines = asyncio.run(collect())
    data = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert [d["choices"][0]["text"] for d in data[:2]] == [NASTY, "é" + NASTY]
    assert len(lines) == sse_body().count(b"\n")
