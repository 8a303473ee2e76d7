"""Scale: one collector process vs ``ShardedCollector`` on Ray, polling every 5 s (prints; not a
test).

A simulated fleet runs in a SEPARATE PROCESS: one ``FleetServer`` with ``step_interval`` (real
time), after ``--warm`` simulated seconds so lazily created series already exist; light load
(``--arrival-rate``) so stepping the simulation does not eat the cores the collector is
measured on. Every configuration runs in its own fresh process (clean peak RSS) and polls at a
fixed 5 s grid:

* ``single``: one ``Collector`` (HTTP, parsing, deltas, reduction, keys in one process);
* ``sharded``: ``ShardedCollector(shards=2)`` and ``(shards=4)`` on a local Ray cluster
  (``num_cpus=2``): actors scrape and parse their shard, the driver merges.

Figures per configuration (the first poll, which builds parser templates and baselines, is
reported apart): median / max poll wall time, CPU seconds per poll and per engine (collector
process; for shards: driver + actors, from ``getrusage`` inside each actor — Ray's own daemons
are not counted), CPU utilisation of the 5 s interval, peak RSS (driver and each actor), keys
per poll. Then the largest fleet one process keeps up with: fleet sizes stepped up until the
median poll exceeds ``--interval`` or the process uses more than 90 % of a core.

    python benchmarks/bench_scale.py                    # ~5-8 min on 2 cores
    python benchmarks/bench_scale.py --quick            # smaller, ~2 min

The machine's load average is printed: on a shared machine wall times are pessimistic, CPU
seconds much less so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetscope.collector.core import Collector

HERE = Path(__file__).resolve()
SERVER_CODE = """
import sys
from fleetscope_sim import FleetServer, LoadProfile, SimFleet
endpoints, dp, step, rate, warm = int(sys.argv[1]), int(sys.argv[2]), *map(float, sys.argv[3:6])
fleet = SimFleet.build(endpoints, dp=dp, seed=1, record_observations=False,
                       load=LoadProfile(arrival_rate=rate))
fleet.run(warm, dt=5.0)  # lazily created series exist before the collectors start
with FleetServer(fleet, step_interval=step) as server:
    for url in server.urls:
        print(url, flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
"""


# ----------------------------------------------------------------------------- the fleet


class FleetProcess:
    """A ``FleetServer`` (real-time stepping) in a child process; reads the URLs it prints."""

    def __init__(
        self, endpoints: int, dp: int, step_interval: float, arrival_rate: float, warm: float
    ):
        self.endpoints = endpoints
        self.dp = dp
        args = [sys.executable, "-c", SERVER_CODE, str(endpoints), str(dp)]
        args += [str(step_interval), str(arrival_rate), str(warm)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=env
        )
        self.urls: list[str] = []
        assert self.proc.stdout is not None
        while len(self.urls) < endpoints:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"simulated fleet exited with {self.proc.wait()}")
            self.urls.append(line.strip())

    def cpu_seconds(self) -> float:
        return _proc_cpu(self.proc.pid)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


# ----------------------------------------------------------------------------- one config


def _self_usage() -> tuple[float, float]:
    """(CPU seconds, peak RSS MB) of this process."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


async def _poll_grid(
    collector: Collector, polls: int, interval: float, usage: Callable[[], float]
) -> dict[str, Any]:
    """Poll on a fixed grid; CPU is measured around polls 2..N (steady state)."""
    walls: list[float] = []
    keys: list[int] = []
    engines: list[float] = []
    start = time.monotonic()
    cpu_first: float | None = None
    for k in range(polls):
        await asyncio.sleep(max(0.0, start + k * interval - time.monotonic()))
        if k == 1:
            cpu_first = usage()
        t0 = time.monotonic()
        view = await collector.poll()
        walls.append(time.monotonic() - t0)
        keys.append(len(view.keys))  # fewer when the fleet did not step (no quantiles)
        engines.append(view.keys.get("inference/agg/engines_reporting", 0.0))
        reporting = view.endpoints_reporting
    cpu_end = usage()
    assert cpu_first is not None  # taken before poll 2 (polls >= 2)
    steady = walls[1:]
    return {
        "first_poll_s": walls[0],
        "median_poll_s": statistics.median(steady),
        "max_poll_s": max(steady),
        "cpu_per_poll_s": (cpu_end - cpu_first) / (polls - 1),
        "keys_per_poll": max(keys),
        "endpoints_reporting": reporting,
        "engines_reporting": statistics.median(engines[1:]),
    }


def run_single(urls: list[str], engines: int, polls: int, interval: float) -> dict[str, Any]:
    from fleetscope.collector.core import Collector
    from fleetscope.sources.http.source import HttpSource

    async def main() -> dict[str, Any]:
        c = Collector(
            urls,
            interval=interval,
            fetch_model_info=False,
            discover_roles=False,
            isolation="inline",
        )
        try:
            out = await _poll_grid(c, polls, interval, lambda: _self_usage()[0])
            # full parses in all (the first poll needs one per body shape; later ones, when
            # a body's series changed); the rest took a template's fast path
            source = c.source
            assert isinstance(source, HttpSource)  # isolation="inline" over URLs
            parsers = source._parsers.values()
            out["full_parses"] = sum(p.full_parses for p in parsers)
            out["fast_parses"] = sum(p.fast_hits for p in parsers)
        finally:
            await c.stop()
        return out

    out = asyncio.run(main())
    out["peak_rss_mb"] = _self_usage()[1]
    out["engines"] = engines
    return out


def run_sharded(
    urls: list[str], engines: int, polls: int, interval: float, shards: list[int]
) -> list[dict[str, Any]]:
    import ray

    from fleetscope.collector.sharded import ShardedCollector

    tmp = tempfile.mkdtemp(prefix="fsbench-", dir="/tmp")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    t0 = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    init_s = time.monotonic() - t0

    def actor_usage(actor: Any) -> tuple[float, float]:
        def usage(_self: Any) -> tuple[float, float]:
            import resource as r

            ru = r.getrusage(r.RUSAGE_SELF)
            return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024

        got: tuple[float, float] = ray.get(actor.__ray_call__.remote(usage), timeout=60)
        return got

    results: list[dict[str, Any]] = []
    try:
        for n in shards:

            async def main(n: int = n) -> dict[str, Any]:
                # the driver in this process (measured here), not in an isolation child
                c = ShardedCollector(urls, shards=n, interval=interval, isolation="inline")
                base = [actor_usage(a)[0] for a in c.shards]  # actor start-up not counted

                def usage() -> float:
                    return _self_usage()[0] + sum(actor_usage(a)[0] for a in c.shards) - sum(base)

                try:
                    out = await _poll_grid(c, polls, interval, usage)
                    out["actor_peak_rss_mb"] = [round(actor_usage(a)[1], 1) for a in c.shards]
                finally:
                    await c.stop()
                return out

            out = asyncio.run(main())
            out["shards"] = n
            out["driver_peak_rss_mb"] = _self_usage()[1]
            out["engines"] = engines
            out["ray_init_s"] = init_s
            results.append(out)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def child_main(args: argparse.Namespace) -> None:
    urls = json.loads(Path(args.urls_file).read_text())
    engines = args.engines
    out: dict[str, Any] | list[dict[str, Any]]
    if args.child == "single":
        out = run_single(urls, engines, args.polls, args.interval)
    else:
        out = run_sharded(urls, engines, args.polls, args.interval, args.shard_counts)
    print("RESULT " + json.dumps(out), flush=True)


def run_child(
    mode: str,
    urls: list[str],
    engines: int,
    args: argparse.Namespace,
    shard_counts: Sequence[int] = (),
    fleet: FleetProcess | None = None,
) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(urls, f)
    cmd = [
        sys.executable,
        str(HERE),
        "--child",
        mode,
        "--urls-file",
        f.name,
        "--engines",
        str(engines),
        "--polls",
        str(args.polls),
        "--interval",
        str(args.interval),
    ]
    if shard_counts:
        cmd += ["--shard-counts", ",".join(map(str, shard_counts))]
    cpu0, t0 = (fleet.cpu_seconds(), time.monotonic()) if fleet else (0.0, 0.0)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(f.name)
    server = (fleet.cpu_seconds() - cpu0) / (time.monotonic() - t0) if fleet else float("nan")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            got = json.loads(line[7:])
            out: list[dict[str, Any]] = got if isinstance(got, list) else [got]
            for r in out:
                r["server_util"] = server  # the simulated fleet's share of a core meanwhile
            return out
    raise RuntimeError(f"{mode} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


# ----------------------------------------------------------------------------- report


def _row(label: str, r: dict[str, Any], interval: float) -> str:
    per_engine_ms = 1000 * r["cpu_per_poll_s"] / max(r["engines_reporting"], 1)
    util = r["cpu_per_poll_s"] / interval
    rss = f"{r.get('peak_rss_mb', r.get('driver_peak_rss_mb', 0)):.0f}"
    if "actor_peak_rss_mb" in r:
        rss += " + actors " + "/".join(f"{x:.0f}" for x in r["actor_peak_rss_mb"])
    return (
        f"{label:<12} {r['engines']:>6} {r['first_poll_s']:>8.2f} {r['median_poll_s']:>8.2f} "
        f"{r['max_poll_s']:>7.2f} {r['cpu_per_poll_s']:>8.2f} {per_engine_ms:>9.2f} "
        f"{util:>6.0%} {r['server_util']:>5.0%} {r['keys_per_poll']:>6} "
        f"{r['endpoints_reporting']:>5}  {rss}"
        + (
            f"  (parses: {r['full_parses']} full, {r['fast_parses']} fast)"
            if "full_parses" in r
            else ""
        )
    )


LEGEND = (
    "1st s: first poll (templates, baselines); median/max s: later polls' wall time; "
    "cpu/poll: CPU s per poll (collector process, + actors for ray); cpu ms/eng: per engine "
    "reporting; cpu/int: CPU per poll / interval (>100 %: needs more than one core); sim: the "
    "simulated fleet's CPU share meanwhile; keys: keys per poll; eps: endpoints reporting"
)
HEADER = (
    f"{'config':<12} {'engines':>6} {'1st s':>8} {'median s':>8} {'max s':>7} "
    f"{'cpu/poll':>8} {'cpu ms/eng':>9} {'cpu/int':>6} {'sim':>5} {'keys':>6} {'eps':>5}  "
    "peak RSS MB"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=["single", "sharded"])
    ap.add_argument("--urls-file")
    ap.add_argument("--engines", type=int, default=0)
    ap.add_argument("--shard-counts", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--polls", type=int, default=5, help="polls per configuration")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--dp", type=int, default=4, help="engines per simulated endpoint")
    ap.add_argument("--engines-main", type=int, default=1024, help="fleet for the comparison")
    ap.add_argument("--sizes", default="256,512,1024,2048", help="fleet sizes for the search")
    ap.add_argument("--step-interval", type=float, default=5.0, help="simulation step (s)")
    ap.add_argument("--arrival-rate", type=float, default=0.2, help="requests/s per engine")
    ap.add_argument("--warm", type=float, default=120.0, help="simulated s before serving")
    ap.add_argument("--quick", action="store_true", help="256 engines, sizes 128,256,512")
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return
    if args.quick:
        args.engines_main, args.sizes, args.polls = 256, "128,256,512", 4
    sizes = sorted({int(x) for x in args.sizes.split(",")})
    largest = max(max(sizes), args.engines_main)
    endpoints = -(-largest // args.dp)
    t_start = time.monotonic()
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}")
    print(
        f"simulated fleet: {endpoints} endpoints x DP={args.dp} = {endpoints * args.dp} engines "
        f"in a separate process (warmed {args.warm:g} simulated s, then stepped every "
        f"{args.step_interval:g} s, "
        f"{args.arrival_rate:g} req/s per engine); collectors poll every {args.interval:g} s"
    )
    fleet = FleetProcess(endpoints, args.dp, args.step_interval, args.arrival_rate, args.warm)
    print(f"fleet serving after {time.monotonic() - t_start:.0f} s")
    print(LEGEND + "\n")
    try:
        n_main = args.engines_main // args.dp
        urls = fleet.urls[:n_main]
        print(HEADER)
        (single,) = run_child("single", urls, n_main * args.dp, args, fleet=fleet)
        print(_row("single", single, args.interval), flush=True)
        sharded = run_child("sharded", urls, n_main * args.dp, args, [2, 4], fleet)
        for res in sharded:
            print(_row(f"ray x{res['shards']}", res, args.interval), flush=True)
        print(f"(ray.init: {sharded[0]['ray_init_s']:.0f} s)\n")
        print(
            "largest fleet one process keeps up with at a "
            f"{args.interval:g} s interval (median poll < interval, < 90 % of a core):"
        )
        print(HEADER)
        best: dict[str, Any] | None = None
        by_size = {n_main * args.dp: single}
        for size in sizes:
            r = by_size.get(size)
            if r is None:
                (r,) = run_child("single", fleet.urls[: size // args.dp], size, args, fleet=fleet)
            print(_row("single", r, args.interval), flush=True)
            ok = r["median_poll_s"] < args.interval and r["cpu_per_poll_s"] < 0.9 * args.interval
            if not ok:
                break
            best = r
        if best is not None:
            cap = 0.9 * args.interval / (best["cpu_per_poll_s"] / best["engines_reporting"])
            print(
                f"-> keeps up with {best['engines']} engines measured; CPU-bound estimate "
                f"(90 % of one core / CPU per engine at that size): ~{cap:.0f} engines"
            )
        else:
            print("-> none of the sizes kept up")
    finally:
        fleet.close()
    print(
        f"\ntotal {time.monotonic() - t_start:.0f} s; load average at end: {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
