"""A bounded, mixed load for real vLLM servers that counts exactly what it sent and received.

Runs with the main Python (only ``httpx``):

    python scripts/real_vllm/loadgen.py --url http://127.0.0.1:8001 --url http://127.0.0.1:8002 \
        --requests 40 --concurrency 6 --out load.json

Per server it sends ``--requests`` requests, cycling through completions and chat, streamed and
not, all built on a few repeated ~300-token prompt prefixes (so vLLM's prefix cache hits: its
blocks are 128 tokens on CPU) plus a short unique tail. It records, per server and in total,
how many requests it sent, how many succeeded, and the prompt and completion tokens the
responses' ``usage`` reported (streams ask for it with ``stream_options.include_usage``).

The output JSON is what the end-to-end test compares fleetscope's window totals with.
Traffic goes only to the URLs given (loopback); every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import httpx
from words import WORDS  # the words the tokenizer was trained on (build_model.py)

MODEL = "tinymodel"

KINDS = ("completion", "chat", "completion_stream", "chat_stream")


class Request(TypedDict):
    """One planned request."""

    kind: str  # one of KINDS
    text: str
    max_tokens: int
    ignore_eos: bool


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.sent += other.sent
        self.ok += other.ok
        self.failed += other.failed
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        pairs = ((other.by_kind, self.by_kind), (other.finish_reasons, self.finish_reasons))
        for src, dst in pairs:
            for k, v in src.items():
                dst[k] = dst.get(k, 0) + v
        self.errors += other.errors


def prefixes(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"document {i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def plan(n: int, seed: int, shared: list[str]) -> list[Request]:
    """The requests for one server: kind, prompt text and max_tokens, deterministic."""
    rng = random.Random(seed)
    out: list[Request] = []
    for i in range(n):
        tail = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        out.append(
            {
                "kind": KINDS[i % len(KINDS)],
                "text": f"{shared[i % len(shared)]}\nquestion {i}: {tail}?",
                "max_tokens": rng.randint(8, 40),
                "ignore_eos": i % 3 != 0,
            }
        )
    return out


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a server-sent-event stream, split on ``\n`` only (a ``\r`` before it is
    dropped). httpx's ``aiter_lines()`` uses ``str.splitlines()``, which also splits on U+0085,
    U+2028, U+2029 and other characters that vLLM leaves raw inside its JSON strings, cutting a
    ``data:`` line in two. Bytes are split before decoding, so a chunk boundary inside a
    multi-byte character is harmless too."""
    buf = b""
    async for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r").decode("utf-8")
    if buf:
        yield buf.removesuffix(b"\r").decode("utf-8")


async def one(client: httpx.AsyncClient, url: str, req: Request, tally: Tally) -> None:
    kind = req["kind"]
    stream = kind.endswith("_stream")
    chat = kind.startswith("chat")
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": req["max_tokens"],
        "temperature": 0.8,
        "ignore_eos": req["ignore_eos"],
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": req["text"]}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = req["text"]
        path = "/v1/completions"
    tally.sent += 1
    tally.by_kind[kind] = tally.by_kind.get(kind, 0) + 1
    usage = None
    finish = None
    try:
        if stream:
            async with client.stream("POST", url + path, json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
                async for line in sse_lines(r.aiter_bytes()):
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        finish = choice.get("finish_reason") or finish
        else:
            r = await client.post(url + path, json=body)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
            data = r.json()
            usage = data.get("usage")
            finish = data["choices"][0].get("finish_reason")
        if not usage:
            raise RuntimeError("response without usage")
    except Exception as e:
        tally.failed += 1
        tally.errors.append(f"{kind} {url}: {type(e).__name__}: {e}"[:500])
        return
    tally.ok += 1
    tally.prompt_tokens += int(usage["prompt_tokens"])
    tally.completion_tokens += int(usage["completion_tokens"])
    tally.finish_reasons[str(finish)] = tally.finish_reasons.get(str(finish), 0) + 1


async def drive(url: str, reqs: list[Request], concurrency: int, deadline: float) -> Tally:
    tally = Tally()
    queue = list(reversed(reqs))
    timeout = httpx.Timeout(120.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as client:

        async def worker() -> None:
            while queue and time.monotonic() < deadline:
                await one(client, url, queue.pop(), tally)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    shared = prefixes(args.prefixes, args.prefix_words, args.seed)
    t0 = time.monotonic()
    deadline = t0 + args.max_seconds
    urls = [u.rstrip("/") for u in args.url]
    tallies = await asyncio.gather(
        *(
            drive(u, plan(args.requests, args.seed + 1 + i, shared), args.concurrency, deadline)
            for i, u in enumerate(urls)
        )
    )
    total = Tally()
    for t in tallies:
        total.add(t)
    return {
        "seconds": round(time.monotonic() - t0, 3),
        "servers": {u: asdict(t) for u, t in zip(urls, tallies, strict=True)},
        "total": asdict(total),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", action="append", required=True, help="server base URL (repeat)")
    p.add_argument("--requests", type=int, default=40, help="requests per server")
    p.add_argument("--concurrency", type=int, default=6, help="in flight per server")
    p.add_argument("--prefixes", type=int, default=3, help="distinct shared prompt prefixes")
    p.add_argument("--prefix-words", type=int, default=250, help="words per prefix (~300 tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=300.0, help="stop sending after this")
    p.add_argument("--out", help="write the JSON result here (default: stdout)")
    args = p.parse_args(argv)
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=1)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    t = result["total"]
    print(
        f"loadgen: {t['sent']} sent, {t['ok']} ok, {t['failed']} failed, "
        f"{t['prompt_tokens']} prompt + {t['completion_tokens']} completion tokens "
        f"in {result['seconds']} s",
        file=sys.stderr,
    )
    return 0 if t["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
