"""The HTTP client alone: fetching every endpoint's ``/metrics`` body, three clients (prints).

A fleet of ``--endpoints`` simulated vLLM servers (default 256, one engine each) is served on
loopback by a SEPARATE PROCESS (``bench_poll.py``'s server), so the server does not share the
GIL or the event loop with the client being measured. Each round fetches every endpoint's
``/metrics`` body once, concurrently, bounded as ``HttpSource`` bounds it (a semaphore of
``--concurrency``, a per-request deadline with ``asyncio.timeout``), and checks status, content
type and the size cap as production does. Keep-alive connections are reused across rounds
(one warm-up round per client opens them). Clients, alternating in one run, rotated per round:

* **httpx**: ``httpx.AsyncClient`` with one pool per endpoint, streamed capped read
  (``_http_client.new_client`` + ``get_capped``, the scrape path before the minimal client);
* **aiohttp**: one ``ClientSession`` (``TCPConnector(limit=0)``), streamed capped read;
* **minimal**: ``_wire.WireClient`` via ``_http_client.fetch_metrics`` (the scrape path now);
* **minimal+wait_for**: the same, bounded by ``asyncio.wait_for`` (a task per request on
  Python 3.11) instead of ``asyncio.timeout``: what the deadline itself costs;
* **floor (blocking)**: not a client: one blocking socket per endpoint, requests one after
  another without an event loop (the loop is stalled for the whole round): what the kernel's
  loopback TCP and the least Python cost.

The simulator does not compress; vLLM (prometheus_client) gzips ``/metrics`` when asked, as
httpx and the minimal client ask. The cost of that is printed at the end: inflating one body
here (the trainer's CPU) and compressing it at prometheus_client's level (the server's).

Reported, medians over ``--runs`` rounds: wall per round, CPU per fetch (``time.process_time``,
all threads, minus the ticker's idle cost), the longest event-loop stall (a 1 ms ticker), and
ratios to the minimal client. Figures are noisy on a loaded machine: read them next to the
printed load average and the ticker's noise floor.

    python benchmarks/bench_http.py [--endpoints 256] [--runs 9] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import socket
import statistics
import sys
import tempfile
import time
import timeit
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_poll import Servers, Ticker, ticker_idle

from fleetscope.exposition import MAX_BODY_BYTES
from fleetscope.sources.http.client import (
    ACCEPT,
    TEXT_TYPES,
    ScrapeError,
    fetch_metrics,
    get_capped,
    new_client,
)
from fleetscope.sources.http.wire import WireClient

Fetch = Callable[[str], Awaitable[bytes]]
HEADERS = {"Accept": ACCEPT}


async def make_httpx() -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    client = new_client(HEADERS, False, 30.0)

    async def fetch(url: str) -> bytes:
        return await get_capped(client, url, headers={}, cap=MAX_BODY_BYTES)

    return fetch, client.aclose


async def make_aiohttp() -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    import aiohttp

    session = aiohttp.ClientSession(
        headers=HEADERS,
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=3600, ssl=False),
        timeout=aiohttp.ClientTimeout(total=None),
    )
    cap = MAX_BODY_BYTES

    async def fetch(url: str) -> bytes:
        async with session.get(url, allow_redirects=False) as r:
            if r.status != 200:
                raise ScrapeError(f"HTTP {r.status}")
            if r.content_type and r.content_type not in TEXT_TYPES:
                raise ScrapeError(f"wrong content type {r.content_type!r}")
            if r.content_length is not None and r.content_length > cap:
                raise ScrapeError("over the cap")
            parts, size = [], 0
            async for chunk in r.content.iter_any():
                size += len(chunk)
                if size > cap:
                    raise ScrapeError("over the cap")
                parts.append(chunk)
            return b"".join(parts)

    return fetch, session.close


async def make_wire() -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    wire = WireClient(HEADERS, None)

    async def fetch(url: str) -> bytes:
        return (await fetch_metrics(wire, url, headers={}, cap=MAX_BODY_BYTES)).body

    return fetch, wire.aclose


async def make_floor(urls: list[str]) -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    socks: dict[str, tuple[socket.socket, bytes]] = {}
    for url in urls:
        host, port = url.split("/")[2].split(":")
        sock = socket.create_connection((host, int(port)))
        request = f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: {ACCEPT}\r\n\r\n"
        socks[url] = (sock, request.encode())

    async def fetch(url: str) -> bytes:  # blocks the loop: a floor, not a client
        sock, request = socks[url]
        sock.sendall(request)
        buf = bytearray()
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf += sock.recv(262144)
        head = bytes(buf[:end]).lower()
        n = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        while len(buf) < end + 4 + n:
            buf += sock.recv(262144)
        return bytes(buf[end + 4 :])

    async def close() -> None:
        for sock, _ in socks.values():
            sock.close()

    return fetch, close


async def one_round(
    fetch: Fetch, urls: list[str], concurrency: int, wait_for: bool
) -> tuple[int, int]:
    """Fetch every URL once; (bodies fetched, bytes)."""
    sem = asyncio.Semaphore(concurrency)

    async def one(url: str) -> int:
        async with sem:
            try:
                if wait_for:
                    body = await asyncio.wait_for(fetch(url), timeout=30.0)
                else:
                    async with asyncio.timeout(30.0):
                        body = await fetch(url)
            except Exception as e:
                print(f"  {url}: {type(e).__name__}: {e}")
                return -1
            return len(body)

    sizes = await asyncio.gather(*(one(u) for u in urls))
    return sum(1 for s in sizes if s >= 0), sum(s for s in sizes if s > 0)


async def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fleetscope-bench-http-"))
    t = time.perf_counter()
    server = Servers(args.endpoints, 1, args.seed, 1, tmp)  # one server process
    metrics = [u.rstrip("/") + "/metrics" for u in server.urls]
    print(
        f"server process: {args.endpoints} endpoints on loopback, up in "
        f"{time.perf_counter() - t:.1f} s; {os.cpu_count()} CPUs; Python "
        f"{sys.version.split()[0]}; load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )
    makers = {"httpx": make_httpx, "aiohttp": make_aiohttp, "minimal": make_wire}
    clients: dict[str, tuple[Fetch, bool]] = {}
    closers = []
    for name, make in makers.items():
        fetch, close = await make()
        clients[name] = (fetch, False)
        closers.append(close)
    clients["minimal+wait_for"] = (clients["minimal"][0], True)
    fetch, close = await make_floor(metrics)
    clients["floor (blocking)"] = (fetch, False)
    closers.append(close)
    ticker = Ticker()
    ticker.start()
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in clients}
    body_bytes = 0
    sample = b""
    try:
        # the ticker's CPU share of a core (subtracted per second of wall) and its longest gap
        _, idle_cpu, idle_gap = await ticker_idle(ticker)
        for name, (fetch, wait_for) in clients.items():  # warm-up: open the connections
            ok, body_bytes = await one_round(fetch, metrics, args.concurrency, wait_for)
            assert ok == len(metrics), f"{name}: {ok} of {len(metrics)} fetched"
        sample = await clients["minimal"][0](metrics[0])
        names = list(clients)
        for i in range(args.runs):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                fetch, wait_for = clients[name]
                await asyncio.sleep(0.05)
                ticker.reset()
                c0, t0 = time.process_time(), time.perf_counter()
                ok, _ = await one_round(fetch, metrics, args.concurrency, wait_for)
                wall = time.perf_counter() - t0
                cpu = max(time.process_time() - c0 - idle_cpu * wall, 0.0)
                await asyncio.sleep(0.002)
                if ok != len(metrics):
                    print(f"  note: {name}: only {ok} of {len(metrics)} fetched")
                rows[name].append((wall, cpu / len(metrics), ticker.max_gap))
    finally:
        await ticker.stop()
        for close in closers:
            await close()
        server.close()

    n = len(metrics)
    print(
        f"{args.runs} rounds per client after a warm-up, {n} fetches of "
        f"~{body_bytes / n / 1e3:.0f} kB each per round, concurrency {args.concurrency}; "
        f"ticker alone {idle_cpu:.1%} of a CPU "
        f"(subtracted), longest gap {idle_gap * 1e3:.1f} ms (noise floor); load average now "
        + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )
    med = {
        name: tuple(statistics.median(r[k] for r in rs) for k in range(3))
        for name, rs in rows.items()
    }
    base = med["minimal"]
    print(
        f"{'client':18}{'wall/round':>12}{'CPU/fetch':>12}{'max stall':>12}"
        f"{'CPU ratio':>11}{'wall ratio':>12}"
    )
    for name, (wall, cpu, stall) in med.items():
        print(
            f"{name:18}{wall * 1e3:9.1f} ms{cpu * 1e3:9.3f} ms{stall * 1e3:9.1f} ms"
            f"{cpu / base[1]:10.1f}x{wall / base[0]:11.1f}x"
        )
    for name, rs in rows.items():
        print(f"  {name}: CPU/fetch per round " + ", ".join(f"{r[1] * 1e3:.3f}" for r in rs))
    packed = gzip.compress(sample)  # prometheus_client's compression (level 9)
    k = 200
    inflate = timeit.timeit(lambda: zlib.decompressobj(wbits=31).decompress(packed), number=k)
    deflate = timeit.timeit(lambda: gzip.compress(sample), number=k // 10)
    print(
        f"gzip (real vLLM, not the simulator): a {len(sample) / 1e3:.0f} kB body is "
        f"{len(packed) / 1e3:.1f} kB compressed; inflating it costs the client "
        f"{inflate / k * 1e3:.3f} ms, compressing it costs the server "
        f"{deflate / (k // 10) * 1e3:.2f} ms"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints", type=int, default=256)
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
