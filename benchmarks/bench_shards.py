"""What sharding costs, and who pays it: CPU per engine in the trainer's process, the isolation
child and the Ray shard actors, at several fleet sizes (prints; not a test).

A simulated fleet (``bench_scale.FleetProcess``: a separate process, stepped in real time) is
polled every ``--interval`` seconds by, each in a fresh process standing for the trainer:

* ``plain inline``: one ``Collector`` in the trainer's process (``isolation="inline"``);
* ``plain process``: one ``Collector`` with its work in the isolation child;
* ``shards inline``: ``ShardedCollector(shards=N)``, the driver's pipeline in the trainer;
* ``shards process``: ``ShardedCollector(shards=N, isolation="process")``: the driver's
  pipeline in the isolation child, which joins the trainer's Ray cluster.

CPU seconds are taken over polls 2..N (steady state) from ``getrusage`` (the trainer),
``/proc/PID/stat`` (the child) and ``getrusage`` inside each shard actor (found by name), less
what the same processes use idle over one interval without polls (Ray's own threads in every
Ray process: printed apart, as % of a core), and divided by the engines reporting. Ray's
daemons (raylet, GCS) are not counted.

    python benchmarks/bench_shards.py --sizes 64,256 --dp 1       # ~6 min on 2 cores
    python benchmarks/bench_shards.py --sizes 1024 --dp 1 --interval 10
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
from pathlib import Path
from typing import Any

from bench_scale import FleetProcess

HERE = Path(__file__).resolve()
CONFIGS = ("plain inline", "plain process", "shards inline", "shards process")


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _pid_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _shards_cpu() -> float:
    """CPU seconds of every fleetscope shard actor alive now (found by name)."""
    import ray

    def usage(_self: Any) -> float:
        import resource as r

        ru = r.getrusage(r.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    total = 0.0
    listed: list[dict[str, str]] = ray.util.list_named_actors(all_namespaces=True)
    for a in listed:
        if a["name"].startswith("fleetscope-shard"):
            actor = ray.get_actor(a["name"], namespace=a["namespace"])
            ref: Any = actor.__ray_call__.remote(usage)
            total += float(ray.get(ref, timeout=60))
    return total


def run_config(
    config: str, urls: list[str], polls: int, interval: float, shards: int
) -> dict[str, Any]:
    """One configuration in this (fresh) process: the figures of polls 2..N."""
    from fleetscope.collector.core import Collector
    from fleetscope.collector.process import ProcessBackend

    sharded = config.startswith("shards")
    isolation = config.split()[1]
    tmp = tempfile.mkdtemp(prefix="fsbsh-", dir="/tmp")
    if sharded:
        import ray

        os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    opts: dict[str, Any] = {
        "interval": interval,
        "fetch_model_info": False,
        "discover_roles": False,
        "isolation": isolation,
    }

    async def main() -> dict[str, Any]:
        c: Collector
        if sharded:
            from fleetscope.collector.sharded import ShardedCollector

            c = ShardedCollector(urls, shards=shards, **opts)
        else:
            c = Collector(urls, **opts)
        backend = c.backend

        def child_pid() -> int | None:
            return backend.link.pid if isinstance(backend, ProcessBackend) else None

        def sample(opening: bool) -> tuple[float, float, float]:
            """The trainer's CPU read after (opening) or before (closing) asking the shards
            for theirs: the asking is in no window."""
            if opening:
                shards_cpu = _shards_cpu() if sharded else 0.0
                return _self_cpu(), _pid_cpu(child_pid()), shards_cpu
            own = _self_cpu()
            return own, _pid_cpu(child_pid()), _shards_cpu() if sharded else 0.0

        walls: list[float] = []
        engines: list[float] = []
        try:
            await c.wait_ready(300)
            t0 = time.monotonic()
            view = await c.poll()  # the first poll: templates and baselines (reported apart)
            walls.append(time.monotonic() - t0)
            # one interval without polls: what the processes cost idle (Ray's own threads
            # in every Ray process), subtracted from what the polls cost
            await asyncio.sleep(interval / 2)
            i0, ti0 = sample(True), time.monotonic()
            await asyncio.sleep(interval)
            i1, ti1 = sample(False), time.monotonic()
            idle = [(b - a) / (ti1 - ti0) for a, b in zip(i0, i1, strict=True)]
            start = time.monotonic() + interval / 2
            first, t_first = sample(True), time.monotonic()
            for k in range(polls - 1):
                await asyncio.sleep(max(0.0, start + k * interval - time.monotonic()))
                t0 = time.monotonic()
                view = await c.poll()
                walls.append(time.monotonic() - t0)
                engines.append(view.keys.get("inference/agg/engines_reporting", 0.0))
            last, t_last = sample(False), time.monotonic()
        finally:
            await c.stop()
        n = max(1.0, statistics.median(engines))
        span = t_last - t_first
        per = [
            1000 * max(0.0, b - a - rate * span) / (polls - 1) / n
            for a, b, rate in zip(first, last, idle, strict=True)
        ]
        return {
            "config": config,
            "endpoints": len(urls),
            "engines": n,
            "first_poll_s": walls[0],
            "median_poll_s": statistics.median(walls[1:]),
            "max_poll_s": max(walls[1:]),
            "trainer_ms": per[0],
            "child_ms": per[1],
            "shards_ms": per[2],
            "idle_pct": [100 * x for x in idle],  # trainer, child, shards: % of a core
        }

    try:
        return asyncio.run(main())
    finally:
        if sharded:
            import ray

            ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def run_child(config: str, urls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(urls, f)
    cmd = [sys.executable, str(HERE), "--child", config, "--urls-file", f.name]
    cmd += ["--polls", str(args.polls), "--interval", str(args.interval)]
    cmd += ["--shards", str(args.shards)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    finally:
        os.unlink(f.name)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            out: dict[str, Any] = json.loads(line[7:])
            return out
    raise RuntimeError(f"{config} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


HEADER = (
    f"{'config':<15} {'endpoints':>9} {'engines':>7} {'median s':>8} {'max s':>6} "
    f"{'trainer':>8} {'child':>7} {'shards':>7} {'total':>7}   idle (trainer/child/shards)"
)


def _row(r: dict[str, Any]) -> str:
    total = r["trainer_ms"] + r["child_ms"] + r["shards_ms"]
    return (
        f"{r['config']:<15} {r['endpoints']:>9} {r['engines']:>7.0f} {r['median_poll_s']:>8.2f} "
        f"{r['max_poll_s']:>6.2f} {r['trainer_ms']:>8.3f} {r['child_ms']:>7.3f} "
        f"{r['shards_ms']:>7.3f} {total:>7.3f}   idle %: "
        + "/".join(f"{x:.1f}" for x in r["idle_pct"])
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=CONFIGS)
    ap.add_argument("--urls-file")
    ap.add_argument("--sizes", default="64,256", help="endpoints per fleet")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--dp", type=int, default=1, help="engines per simulated endpoint")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--polls", type=int, default=6, help="polls per configuration")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--arrival-rate", type=float, default=0.2, help="requests/s per engine")
    ap.add_argument("--warm", type=float, default=60.0, help="simulated s before serving")
    args = ap.parse_args()
    if args.child:
        urls = json.loads(Path(args.urls_file).read_text())
        print(
            "RESULT "
            + json.dumps(run_config(args.child, urls, args.polls, args.interval, args.shards)),
            flush=True,
        )
        return
    sizes = sorted(int(x) for x in args.sizes.split(","))
    configs = [c.strip() for c in args.configs.split(",")]
    t_start = time.monotonic()
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}")
    fleet = FleetProcess(max(sizes), args.dp, args.interval, args.arrival_rate, args.warm)
    print(
        f"simulated fleet: {max(sizes)} endpoints x DP={args.dp}, stepped every "
        f"{args.interval:g} s; {args.shards} shards; polls every {args.interval:g} s\n"
    )
    print(
        "trainer / child / shards / total: CPU ms per engine per poll (net of idle); idle: "
        "each process kind's CPU without polls, % of a core (shards: all actors together)"
    )
    print(HEADER, flush=True)
    try:
        for size in sizes:
            for config in configs:
                print(_row(run_child(config, fleet.urls[:size], args)), flush=True)
    finally:
        fleet.close()
    print(
        f"\ntotal {time.monotonic() - t_start:.0f} s; load average at end: {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
