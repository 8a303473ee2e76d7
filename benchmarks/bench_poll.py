"""One poll of a large simulated fleet, end to end: fleetscope in-process, fleetscope in
isolation mode and prime-rl's real collector, alternating on the same fleet (prints).

How to run (from the repository root; a 2-core machine is enough, medians over ``--runs``)::

    PYTHONPATH=src python benchmarks/bench_poll.py --endpoints 256 --runs 5
    PYTHONPATH=src python benchmarks/bench_poll.py --endpoints 1024 --runs 5
    PYTHONPATH=src python benchmarks/bench_poll.py --modes inline,prime-rl --endpoints 64

Options: ``--modes`` (any of ``inline,process,prime-rl``; default all three), ``--dp`` (engines
per endpoint), ``--timeout`` (per scrape, for every mode, default 30 s: the machine is shared),
``--server-procs`` (fleet server processes; default 1 up to 256 endpoints, 2 above), ``--jsonl``
(give the fleetscope collectors a ``JsonlSink``; by default they have no sinks, as the issue's
table), ``--warmup`` (polls per mode before the timed runs, default 2).

The fleet of ``--endpoints`` simulated vLLM servers (one engine each by default) is served on
loopback by SEPARATE PROCESSES (``--server-procs``, endpoints split between them), so the
servers share neither the GIL nor the event loop with what is measured. Between two rounds
the driver asks every server to step its fleet by 1 s and render the bodies (outside the
timed part), so every poll sees new values in the same shape, as in production. Each round
runs every mode once, in a rotating order, then an idle control.

Modes, each ``await``-ed on this process's event loop (the trainer's loop):

* ``inline``: ``Collector(urls, isolation="inline").poll()`` -- HTTP (bounded concurrency),
  parse (worker thread, template fast path), per-engine deltas, reductions, keys, health;
* ``process``: ``Collector(urls, isolation="process").poll()`` -- the same work in a child
  process; this process receives the finished row;
* ``prime-rl``: ``InferenceMetricsCollector.collect_and_log()`` of prime-rl's orchestrator,
  vendored almost verbatim in ``benchmarks/_prime_rl_poll.py`` (its httpx clients, gathered
  ``GET /metrics``, ``text_string_to_metric_families`` parse, ``build_metrics`` with per-engine
  values, counter rates, histogram means, scope min/max/sum/mean/median and pooled quantiles,
  the load samples), all on the event loop, as prime-rl runs it (``wandb.log`` is a stub: its
  cost is not counted);
* ``idle``: the control, ``asyncio.sleep()`` with nothing else running, as long as that
  round's isolation (else in-process) poll, 1-10 s: the stall the loaded machine itself
  causes in that time (the noise floor of the stall column).

Reported, medians over the runs: poll wall time; CPU time of THIS process (the trainer's) per
poll and per engine (``time.process_time``: every thread of this process, which is what the
trainer pays, minus the ticker's own cost: its CPU per tick measured idle, times the ticks that
ran during the poll); for ``process`` also the child's CPU (from
``/proc/<pid>/stat``, all its threads), shown separately and never added to the trainer's;
the longest event-loop stall during the poll (a ticker task sleeping 1 ms records the
largest gap between two wake-ups, minus the 1 ms); the fleet servers' CPU during the poll
(if it approaches one core per server process, the server is the bottleneck); for prime-rl the
parts of its poll on the loop (parse, ``build_metrics``). Then prime-rl / fleetscope ratios
and every target of issue 12 as "met" or "missed by". The machine is shared: read the figures
next to the load averages printed before and after and the idle control's stall.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICK = 0.001
HERE = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- server processes


def serve(endpoints: int, dp: int, seed: int) -> None:
    """Server process: build and serve the fleet; stdin ``step`` -> step 1 s; ``quit``."""
    from fleetscope_sim import FleetServer, SimFleet

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


class Servers:
    """``procs`` server processes, ``endpoints`` split between them (each its own seed)."""

    def __init__(self, endpoints: int, dp: int, seed: int, procs: int, tmp: Path):
        procs = max(1, min(procs, endpoints))
        sizes = [endpoints // procs + (i < endpoints % procs) for i in range(procs)]
        self.procs: list[subprocess.Popen[str]] = []
        for i, n in enumerate(sizes):
            with (tmp / f"server{i}.log").open("w") as err:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--serve", str(n), str(dp), str(seed + i)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                        bufsize=1,
                    )
                )
        self.urls: list[str] = []
        for p in self.procs:  # they build their fleets concurrently
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"a fleet server process failed: see {tmp}/server*.log")
            self.urls += json.loads(line)["urls"]

    def step(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("step\n")
            p.stdin.flush()
        for p in self.procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ok"

    def cpu(self) -> float:
        return sum(proc_cpu(p.pid) for p in self.procs)

    def close(self) -> None:
        for p in self.procs:
            try:
                assert p.stdin is not None
                p.stdin.write("quit\n")
                p.stdin.flush()
                p.wait(timeout=30)
            except Exception:
                p.kill()
                p.wait()


def proc_cpu(pid: int | None) -> float:
    """user + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return 0.0
    fields = data[data.rindex(")") + 2 :].split()  # fields 3.. (comm may contain spaces)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


# --------------------------------------------------------------------------- measuring


class Ticker:
    """Wakes up every 1 ms; ``max_gap`` is the longest time the loop did not let it run."""

    def __init__(self) -> None:
        self.max_gap = 0.0
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last - TICK)
            self.ticks += 1
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


async def ticker_idle(ticker: Ticker, seconds: float = 2.0) -> tuple[float, float, float]:
    """With nothing else to do: the CPU seconds one tick of the ticker costs by itself
    (subtracted from poll CPU times per tick that ran during the poll: a blocked loop runs
    fewer), its CPU share of one core, and its longest gap (the machine's noise floor)."""
    ticker.reset()
    n0, c0, t0 = ticker.ticks, time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu, ticks = time.process_time() - c0, ticker.ticks - n0
    return cpu / max(ticks, 1), cpu / (time.perf_counter() - t0), ticker.max_gap


@dataclass
class Sample:
    wall: float
    cpu: float  # this (the trainer's) process, minus the ticker's idle cost
    stall: float
    child_cpu: float | None  # isolation mode's child process
    server_cpu: float


@dataclass
class Mode:
    name: str
    poll: Callable[[], Awaitable[int]]  # one poll; returns endpoints that answered
    child_pid: Callable[[], int | None] = lambda: None
    keys: Callable[[], int] = lambda: 0
    close: Callable[[], Awaitable[None]] | None = None


async def measure(
    mode: Mode, ticker: Ticker, tick_cpu: float, expected: int, servers: Servers
) -> Sample:
    """One ``await mode.poll()``: wall, CPU, longest loop stall, child and server CPU."""
    await asyncio.sleep(0.05)  # let the previous poll's stragglers settle
    pid = mode.child_pid()
    ticker.reset()
    s0, k0 = servers.cpu(), proc_cpu(pid)
    n0, c0, t0 = ticker.ticks, time.process_time(), time.perf_counter()
    reporting = await mode.poll()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0 - tick_cpu * (ticker.ticks - n0)
    await asyncio.sleep(2 * TICK)  # a stall at the very end is seen by the next tick
    stall = ticker.max_gap
    child = proc_cpu(pid) - k0 if pid is not None else None
    server = servers.cpu() - s0
    if pid is not None and mode.child_pid() != pid:
        print(f"  note: {mode.name}: the child process changed during this poll")
    if reporting != expected:
        print(f"  note: {mode.name}: only {reporting} of {expected} endpoints answered this poll")
    return Sample(wall, max(cpu, 0.0), stall, child, server)


# --------------------------------------------------------------------------- the approaches


def make_fleetscope(name: str, urls: list[str], args: argparse.Namespace, tmp: Path) -> Mode:
    from fleetscope.collector.core import Collector
    from fleetscope.sinks.jsonl import JsonlSink

    # the last poll (at stop) sees a frozen fleet: no health warnings for "stalled" engines
    logging.getLogger("fleetscope").setLevel(logging.ERROR)
    sinks = [JsonlSink(tmp / f"polls-{name}.jsonl")] if args.jsonl else []
    collector = Collector(
        urls,
        isolation=name,
        interval=3600,
        sinks=sinks,
        timeout=args.timeout,
        verify=False,
    )
    backend = type(collector.backend).__name__
    assert backend == ("ProcessBackend" if name == "process" else "InlineBackend")

    async def poll() -> int:
        view = await collector.poll()
        return view.endpoints_reporting

    def child_pid() -> int | None:
        child = collector.backend.link._child  # type: ignore[attr-defined]
        return child.proc.pid if child is not None else None

    return Mode(
        name,
        poll,
        child_pid=child_pid if name == "process" else (lambda: None),
        keys=lambda: len(collector.last.keys) if collector.last else 0,
        close=collector.stop,
    )


class PrimeRl:
    """prime-rl's ``InferenceMetricsCollector`` (benchmarks/_prime_rl_poll.py), with its parse
    and ``build_metrics`` timed (wall and CPU of the loop's thread) without changing them."""

    def __init__(self, urls: list[str], timeout: float):
        sys.path.insert(0, str(HERE))
        import _prime_rl_poll as pr

        self.pr = pr
        pr.FETCH_TIMEOUT = timeout
        logging.getLogger("prime_rl").setLevel(logging.ERROR)
        self.collector = pr.InferenceMetricsCollector(pr.setup_admin_clients(urls))
        self.parts: dict[str, list[tuple[float, float]]] = {"parse": [], "build_metrics": []}
        self._acc: dict[str, list[float]] = {}
        pr.parse_prometheus_text = self._timed("parse", pr.parse_prometheus_text)
        self.collector.build_metrics = self._timed(  # type: ignore[method-assign]
            "build_metrics", self.collector.build_metrics
        )

    def _timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any) -> Any:
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a)
            finally:
                acc = self._acc.setdefault(part, [0.0, 0.0])
                acc[0] += time.perf_counter() - t
                acc[1] += time.thread_time() - c

        return wrapper

    async def poll(self) -> int:
        self._acc = {}
        start = time.monotonic()
        await self.collector.collect_and_log()  # what prime-rl's poll_loop awaits
        for part, series in self.parts.items():
            wall, cpu = self._acc.get(part, [0.0, 0.0])
            series.append((wall, cpu))
        return sum(1 for s in self.collector.previous.values() if s.timestamp >= start)

    async def close(self) -> None:
        await self.collector.stop()
        for endpoint in self.collector.endpoints:
            await endpoint.client.aclose()

    def mode(self) -> Mode:
        return Mode("prime-rl", self.poll, keys=lambda: len(self.pr.wandb.last), close=self.close)


# --------------------------------------------------------------------------- report


def ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def upper(what: str, value: float, target: float, unit: Callable[[float], str]) -> str:
    if value <= target:
        return f"  {what}: {unit(value)} <= {unit(target)}: target met"
    return (
        f"  {what}: {unit(value)} > {unit(target)}: target MISSED by {unit(value - target)} "
        f"({value / target:.1f}x the target)"
    )


def lower_ratio(what: str, value: float, target: float) -> str:
    if value >= target:
        return f"  {what}: {value:.1f}x >= {target:g}x: target met"
    return (
        f"  {what}: {value:.1f}x < {target:g}x: target MISSED by {target / value:.1f}x "
        f"(needs {target:g}x)"
    )


def report(
    args: argparse.Namespace,
    results: dict[str, list[Sample]],
    idle: list[float],
    idle_span: float,
    prime: PrimeRl | None,
) -> None:
    engines = args.endpoints * args.dp
    med: dict[str, Sample] = {}
    print(
        f"{'per poll':10}{'wall':>11}{'CPU':>11}{'CPU/engine':>13}{'stall':>11}"
        f"{'child CPU/engine':>19}{'server CPU':>13}"
    )
    for name, rows in results.items():
        child = [r.child_cpu for r in rows if r.child_cpu is not None]
        m = Sample(
            statistics.median(r.wall for r in rows),
            statistics.median(r.cpu for r in rows),
            statistics.median(r.stall for r in rows),
            statistics.median(child) if child else None,
            statistics.median(r.server_cpu for r in rows),
        )
        med[name] = m
        child_col = f"{m.child_cpu / engines * 1e3:.3f} ms" if m.child_cpu is not None else "-"
        print(
            f"{name:10}{ms(m.wall):>11}{ms(m.cpu):>11}{m.cpu / engines * 1e3:>10.3f} ms"
            f"{ms(m.stall):>11}{child_col:>19}{ms(m.server_cpu):>13}"
        )
    print(f"{'idle':10}{ms(idle_span):>11}{'-':>11}{'-':>13}{ms(statistics.median(idle)):>11}")
    print("runs (wall ms / trainer CPU ms / stall ms):")
    for name, rows in results.items():
        print(
            f"  {name:9} wall {', '.join(f'{r.wall * 1e3:.0f}' for r in rows)}; "
            f"CPU {', '.join(f'{r.cpu * 1e3:.0f}' for r in rows)}; "
            f"stall {', '.join(f'{r.stall * 1e3:.1f}' for r in rows)}"
        )
    print(f"  {'idle':9} stall {', '.join(f'{g * 1e3:.1f}' for g in idle)}")
    if prime is not None:
        # the first entries are the warm-up polls
        parts = []
        for part, series in prime.parts.items():
            timed = series[args.warmup :]
            w = statistics.median(x for x, _ in timed)
            c = statistics.median(y for _, y in timed)
            parts.append(f"{part} {ms(w)} wall / {ms(c)} CPU ({c / engines * 1e3:.2f} ms/engine)")
        print(
            "prime-rl's poll on the event loop: "
            + "; ".join(parts)
            + "; the rest is HTTP (httpx, one client per server) and the load samples"
        )

    pr = med.get("prime-rl")
    if pr is not None:
        for name in ("inline", "process"):
            if name in med:
                fs = med[name]
                cpu = "CPU (trainer process)" if name == "process" else "CPU"
                print(
                    f"prime-rl / {name}: wall {ratio(pr.wall, fs.wall):.1f}x, {cpu} "
                    f"{ratio(pr.cpu, fs.cpu):.1f}x, longest loop stall "
                    f"{ratio(pr.stall, fs.stall):.1f}x"
                )
        if "process" in med and med["process"].child_cpu is not None:
            p = med["process"]
            assert p.child_cpu is not None
            print(
                "prime-rl / process, trainer + child CPU (the whole machine's cost): "
                f"{ratio(pr.cpu, p.cpu + p.child_cpu):.1f}x"
            )

    def per_engine(x: float) -> str:
        return f"{x * 1e3:.3f} ms"

    print(f"targets (issue 12; at {args.endpoints} endpoints here):")
    if "process" in med:
        p = med["process"]
        print(" isolation (the issue states these at 1,024 engines):")
        print(upper("longest loop stall", p.stall, 0.010, ms))
        print(upper("trainer CPU per engine", p.cpu / engines, 0.0001, per_engine))
        print(upper("wall per poll", p.wall, 1.0, ms))
    if "inline" in med:
        i = med["inline"]
        print(" in-process (the issue states these at 256 engines):")
        print(upper("CPU per engine", i.cpu / engines, 0.00045, per_engine))
        print(upper("longest loop stall", i.stall, 0.050, ms))
    if pr is not None:
        print(" against prime-rl's collector:")
        if "inline" in med:
            print(lower_ratio("CPU, in-process", ratio(pr.cpu, med["inline"].cpu), 30))
            print(lower_ratio("stall, in-process", ratio(pr.stall, med["inline"].stall), 50))
        if "process" in med:
            print(lower_ratio("CPU, isolation (trainer)", ratio(pr.cpu, med["process"].cpu), 100))
            print(lower_ratio("stall, isolation", ratio(pr.stall, med["process"].stall), 50))


# --------------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> None:
    t = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="fleetscope-bench-"))
    print(f"load average before: {loadavg()} ({os.cpu_count()} CPUs)")
    procs = args.server_procs or (1 if args.endpoints <= 256 else 2)
    servers = Servers(args.endpoints, args.dp, args.seed, procs, tmp)
    engines = args.endpoints * args.dp
    print(
        f"{len(servers.procs)} server process(es): {args.endpoints} endpoints x {args.dp} "
        f"engine(s) on loopback, up in {time.perf_counter() - t:.1f} s; timeout {args.timeout:g} s"
        f"; fleetscope sinks: {'JsonlSink' if args.jsonl else 'none'}"
    )
    modes: list[Mode] = []
    prime: PrimeRl | None = None
    ticker = Ticker()
    ticker.start()
    results: dict[str, list[Sample]] = {}
    idle: list[float] = []
    idle_spans: list[float] = []
    try:
        for name in args.modes:
            if name == "prime-rl":
                prime = PrimeRl(servers.urls, args.timeout)
                modes.append(prime.mode())
            else:
                modes.append(make_fleetscope(name, servers.urls, args, tmp))
        results = {m.name: [] for m in modes}
        tick_cpu, idle_cpu, idle_gap = await ticker_idle(ticker)
        # warm-up: connections, templates, the child, baselines (the first poll is a baseline)
        t = time.perf_counter()
        for w in range(args.warmup):
            if w:
                servers.step()
            for m in modes:
                got = await m.poll()
                if got != args.endpoints:
                    print(f"  note: warm-up {m.name}: {got} of {args.endpoints} answered")
        print(
            f"warm-up ({args.warmup} poll(s) per mode) {time.perf_counter() - t:.1f} s; "
            f"ticker alone: {idle_cpu:.1%} of a CPU ({tick_cpu * 1e6:.0f} us per tick, "
            f"subtracted per tick), longest gap "
            f"{idle_gap * 1e3:.1f} ms; load average {loadavg()}"
        )
        for i in range(args.runs):
            servers.step()
            order = modes[i % len(modes) :] + modes[: i % len(modes)]
            for m in order:
                results[m.name].append(await measure(m, ticker, tick_cpu, args.endpoints, servers))
            # the control: nothing else on the loop, as long as this round's fleetscope poll
            span = next((results[n][-1].wall for n in ("process", "inline") if n in results), 1.0)
            span = min(max(span, 1.0), 10.0)
            idle_spans.append(span)
            ticker.reset()
            await asyncio.sleep(span)
            idle.append(ticker.max_gap)
        keys = {m.name: m.keys() for m in modes}
    finally:
        await ticker.stop()
        for m in modes:
            if m.close is not None:
                with contextlib.suppress(Exception):
                    await m.close()
        servers.close()

    print(
        f"{args.runs} rounds after the warm-up, {engines} engines; keys per poll: "
        + ", ".join(f"{k} {v}" for k, v in keys.items())
        + f"; load average after: {loadavg()}"
    )
    report(args, results, idle, statistics.median(idle_spans), prime)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--endpoints", type=int, default=256)
    p.add_argument("--dp", type=int, default=1, help="engines per endpoint")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2, help="polls per mode before the runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="per scrape, every mode")
    p.add_argument("--modes", default="inline,process,prime-rl")
    p.add_argument("--server-procs", type=int, default=0, help="0: 1 up to 256 endpoints, else 2")
    p.add_argument("--jsonl", action="store_true", help="fleetscope collectors get a JsonlSink")
    args = p.parse_args()
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in args.modes:
        if m not in ("inline", "process", "prime-rl"):
            p.error(f"unknown mode {m!r} (inline, process, prime-rl)")
    if args.warmup < 1:
        p.error("--warmup must be >= 1 (fleetscope's first poll is a baseline)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
