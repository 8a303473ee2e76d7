"""One poll of a large simulated fleet, end to end, fleetscope vs prime-rl's approach (prints).

A fleet of ``--endpoints`` simulated vLLM servers (default 256, one engine each) is served on
loopback by a SEPARATE PROCESS, so the server does not share the GIL (or the event loop) with
the collector being measured. Between two polls the driver asks the server to step the fleet
(outside the timed part), so every poll sees new values in the same shape, as in production.

Per poll, after one warm-up poll, ``--runs`` times (alternating the two approaches on the same
fleet state):

* **fleetscope**: ``await Collector.poll()`` -- HTTP (httpx, bounded concurrency), parse (worker
  thread, template fast path), per-engine deltas, reduction, keys, health, a ``JsonlSink`` line
  in a temporary folder;
* **prime-rl's approach**: ``httpx.AsyncClient`` GET of every ``/metrics`` (gathered), then
  ``prometheus_client.parser.text_string_to_metric_families`` + grouping every sample by its
  ``engine`` label, on the event loop (no deltas, reductions or logging: a lower bound of its
  cost).

Reported, medians over the runs: poll wall time; CPU time of the collector process per poll
and per engine (``time.process_time``, all threads, minus the ticker's own idle cost); the
event loop's longest stall during the poll (a ticker task sleeping 1 ms records the largest gap
between two wake-ups, minus the 1 ms); for prime-rl also the part spent parsing on the loop.
Then prime-rl / fleetscope ratios. On a shared machine, read them next to the printed load
average and the ticker's noise floor.

    python benchmarks/bench_poll.py [--endpoints 256] [--dp 1] [--runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

TICK = 0.001


# --------------------------------------------------------------------------- server process


def serve(endpoints: int, dp: int, seed: int) -> None:
    """Server process: build and serve the fleet; stdin ``step`` -> step 1 s; ``quit``."""
    from fleetscope.simulate import FleetServer, SimFleet

    fleet = SimFleet.build(endpoints, dp=dp, seed=seed, record_observations=False)
    fleet.step(5.0)
    # idle keep-alive connections stay open however slow a loaded machine makes the rounds
    with FleetServer(fleet, keepalive_timeout=3600) as server:
        print(json.dumps({"urls": server.urls}), flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "step":
                fleet.step(1.0)
                for ep in fleet.endpoints:  # render now, not while the collector is timed
                    ep.body()
                print("ok", flush=True)
            elif cmd == "quit":
                break


class Server:
    def __init__(self, endpoints: int, dp: int, seed: int, log: Path):
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", str(endpoints), str(dp), str(seed)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
            )
        assert self.proc.stdout is not None
        self.urls: list[str] = json.loads(self.proc.stdout.readline())["urls"]

    def step(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------- measuring


class Ticker:
    """Wakes up every 1 ms; ``max_gap`` is the longest time the loop did not let it run."""

    def __init__(self) -> None:
        self.max_gap = 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last - TICK)
            last = now

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def reset(self) -> None:
        self.max_gap = 0.0

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def ticker_idle(ticker: Ticker, seconds: float = 1.0) -> tuple[float, float]:
    """With nothing else to do: the CPU seconds per second the ticker costs by itself
    (subtracted from poll CPU times), and its longest gap (the machine's noise floor)."""
    ticker.reset()
    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    return (time.process_time() - c0) / (time.perf_counter() - t0), ticker.max_gap


async def measure(
    poll, ticker: Ticker, idle_cpu: float, expected: int
) -> tuple[float, float, float]:
    """(wall s, CPU s, longest loop stall s) of one ``await poll()``."""
    await asyncio.sleep(0.05)  # let the previous poll's stragglers settle
    ticker.reset()
    c0, t0 = time.process_time(), time.perf_counter()
    reporting = await poll()
    wall = time.perf_counter() - t0
    if reporting != expected:
        print(f"  note: only {reporting} of {expected} endpoints answered this poll")
    cpu = time.process_time() - c0 - idle_cpu * wall
    await asyncio.sleep(2 * TICK)  # a stall at the very end is seen by the next tick
    return wall, max(cpu, 0.0), ticker.max_gap


# --------------------------------------------------------------------------- the two approaches


def make_fleetscope(urls: list[str], out: Path):
    from fleetscope.collector import Collector
    from fleetscope.sinks.jsonl import JsonlSink

    # the last poll (at stop) sees a frozen fleet: no health warnings for 256 "stalled" engines
    logging.getLogger("fleetscope").setLevel(logging.ERROR)

    collector = Collector(urls, interval=3600, sinks=[JsonlSink(out)], timeout=30, verify=False)

    async def poll() -> int:
        view = await collector.poll()
        return view.endpoints_reporting

    return collector, poll


def make_prime_rl(urls: list[str]):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    client = httpx.AsyncClient(timeout=30)
    metrics_urls = [u.rstrip("/") + "/metrics" for u in urls]
    last: dict[str, dict] = {}

    async def poll() -> int:
        responses = await asyncio.gather(*(client.get(u) for u in metrics_urls))
        t_parse, c_parse = time.perf_counter(), time.thread_time()
        ok = 0
        for url, r in zip(metrics_urls, responses, strict=True):
            if r.status_code != 200:
                continue
            ok += 1
            by_engine: dict[str | None, dict] = defaultdict(dict)
            for family in text_string_to_metric_families(r.text):  # on the event loop
                for s in family.samples:
                    labels = dict(s.labels)
                    engine = labels.pop("engine", None)
                    key = (s.name, tuple(sorted(labels.items())))
                    by_engine[engine][key] = s.value
            last[url] = by_engine
        parse_seconds.append((time.perf_counter() - t_parse, time.thread_time() - c_parse))
        return ok

    parse_seconds: list[tuple[float, float]] = []  # (wall, CPU of the loop's thread)
    poll.parse_seconds = parse_seconds  # type: ignore[attr-defined]
    return client, poll


# --------------------------------------------------------------------------- main


def fmt_ms(x: float) -> str:
    return f"{x * 1e3:8.1f} ms"


async def run(args: argparse.Namespace) -> None:
    t = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="fleetscope-bench-"))
    server = Server(args.endpoints, args.dp, args.seed, tmp / "server.log")
    engines = args.endpoints * args.dp
    print(
        f"server process: {args.endpoints} endpoints x {args.dp} engine(s) on loopback, "
        f"up in {time.perf_counter() - t:.1f} s; {os.cpu_count()} CPUs, load average "
        + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )
    collector, fs_poll = make_fleetscope(server.urls, tmp / "polls.jsonl")
    client, pr_poll = make_prime_rl(server.urls)
    ticker = Ticker()
    ticker.start()
    results: dict[str, list[tuple[float, float, float]]] = {"fleetscope": [], "prime-rl": []}
    try:
        idle_cpu, idle_gap = await ticker_idle(ticker)
        # warm-up: connections, templates, baselines (fleetscope's first poll is a baseline)
        for poll in (fs_poll, pr_poll):
            assert await poll() == args.endpoints
        for i in range(args.runs):
            server.step()
            order = [("fleetscope", fs_poll), ("prime-rl", pr_poll)]
            if i % 2:
                order.reverse()
            for name, poll in order:
                results[name].append(await measure(poll, ticker, idle_cpu, args.endpoints))
        last_keys = len(collector.last.keys) if collector.last else 0
    finally:
        await ticker.stop()
        await collector.stop()
        await client.aclose()
        server.close()

    print(
        f"{args.runs} polls each after a warm-up; fleetscope logs {last_keys} keys per poll to "
        f"{tmp / 'polls.jsonl'}; ticker alone: {idle_cpu:.1%} of a CPU (subtracted), longest "
        f"gap {idle_gap * 1e3:.1f} ms (noise floor); load average now "
        + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )
    med: dict[str, tuple[float, float, float]] = {}
    print(f"{'':12}{'wall':>12}{'CPU':>12}{'CPU/engine':>14}{'max loop stall':>17}")
    for name, rows in results.items():
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        stall = statistics.median(r[2] for r in rows)
        med[name] = (wall, cpu, stall)
        per_engine = cpu / engines
        print(
            f"{name:12}{fmt_ms(wall):>12}{fmt_ms(cpu):>12}"
            f"{per_engine * 1e3:11.3f} ms{fmt_ms(stall):>17}"
        )
        print(
            f"{'':12}(runs: wall {', '.join(f'{r[0] * 1e3:.0f}' for r in rows)} ms; "
            f"stall {', '.join(f'{r[2] * 1e3:.1f}' for r in rows)} ms)"
        )
    parse = pr_poll.parse_seconds[1:]  # without the warm-up
    p_wall = statistics.median(w for w, _ in parse)
    p_cpu = statistics.median(c for _, c in parse)
    print(
        f"{'':12}(of which parse + group-by-engine on the event loop: {p_wall * 1e3:.0f} ms wall, "
        f"{p_cpu * 1e3:.0f} ms CPU = {p_cpu / engines * 1e3:.1f} ms per engine; the rest is "
        "HTTP through one shared httpx pool)"
    )
    fs, pr = med["fleetscope"], med["prime-rl"]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.1f}x" if b > 0 else "n/a"

    print(
        f"prime-rl / fleetscope: wall {ratio(pr[0], fs[0])}, CPU {ratio(pr[1], fs[1])}, "
        f"longest loop stall {ratio(pr[2], fs[2])}"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints", type=int, default=256)
    p.add_argument("--dp", type=int, default=1, help="engines per endpoint")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
