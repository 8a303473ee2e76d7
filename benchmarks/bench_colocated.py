"""What reading colocated engines costs, per engine, next to scraping the same state over HTTP
(prints; not a test).

The engine state: vLLM 0.32's ``vllm:`` families (the simulator's catalogue: every family,
label value and bucket layout a real server exposes) as real prometheus_client ``Counter`` /
``Gauge`` / ``Histogram`` objects, for 1 to 8 engines (``engine`` label), in a registry that
also has prometheus_client's process, platform and GC collectors (what ``REGISTRY`` holds in a
vLLM process). For each engine count:

* ``InProcessSource``: ``read()`` (``collect()``, the lines, the parse), as the source's worker
  thread runs it each poll; ``collect()`` alone beside it;
* HTTP, the same registry served by a child process (prometheus_client's ``generate_latest``
  per request, as vLLM's API server does): the collector's CPU per scrape (fetch + parse,
  fleetscope's HTTP source, warm connection), and the server's render (``generate_latest``)
  that a scrape costs the engine's process;
* ``MultiprocessSource``: the same state written by a child process in prometheus_client's
  multiprocess mode (gauges ``mostrecent``, as vLLM's), ``read()`` (files, merge, lines,
  parse); and over HTTP, a ``MultiProcessCollector`` registry on that directory served by a
  child process: the collector's CPU per scrape and the server's render.

One run; every figure is the median over ``--runs`` rounds (each round a calibrated batch), in
milliseconds per engine (the body's cost divided by its engines).

    python benchmarks/bench_colocated.py [--runs 9] [--engines 1 2 4 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from fleetscope.sources.http.source import Endpoint, HttpSource
from fleetscope.sources.inprocess import InProcessSource
from fleetscope.sources.multiproc import MultiprocessSource
from fleetscope_sim.vllm_families import FAMILIES, bucket_bounds

HERE = Path(__file__).resolve()
_multiprocess_collector: Callable[..., object] = MultiProcessCollector  # untyped there
MAX_MODEL_LEN = 512


def build_registry(engines: int, registry: CollectorRegistry) -> CollectorRegistry:
    """vLLM 0.32's families for ``engines`` engines, as metric objects with values."""
    for spec in FAMILIES:
        labels = ["model_name", *(["engine"] if spec.per_engine else [])]
        labels += [spec.label] if spec.label else []
        metric: Counter | Gauge | Histogram
        if spec.kind == "counter":
            metric = Counter(spec.name, spec.help, labels, registry=registry)
        elif spec.kind == "gauge":
            metric = Gauge(
                spec.name, spec.help, labels, registry=registry, multiprocess_mode="mostrecent"
            )
        elif spec.kind == "histogram":
            bounds = bucket_bounds(spec, MAX_MODEL_LEN)
            metric = Histogram(spec.name, spec.help, labels, buckets=bounds, registry=registry)
        else:
            continue
        for e in range(engines if spec.per_engine else 1):
            for value in spec.label_values or ("x",) if spec.label else (None,):
                child = metric.labels(
                    "tinymodel", *([str(e)] if spec.per_engine else []), *([value] if value else [])
                )
                if isinstance(child, Counter):
                    child.inc(100 * (e + 1))
                elif isinstance(child, Gauge):
                    child.set(e + 0.5)
                else:
                    for v in (bounds[0], bounds[len(bounds) // 2], bounds[-1] * 2):
                        child.observe(v)
    return registry


def per_call(fn: Callable[[], object], runs: int, min_batch_seconds: float = 0.05) -> float:
    """Median seconds per call of ``fn()`` (CPU of this process), over ``runs`` batches."""
    fn()
    n = 1
    while True:
        t = time.process_time()
        for _ in range(n):
            fn()
        if time.process_time() - t >= min_batch_seconds:
            break
        n *= 2
    out = []
    for _ in range(runs):
        gc.collect()
        t = time.process_time()
        for _ in range(n):
            fn()
        out.append((time.process_time() - t) / n)
    return statistics.median(out)


def http_client_cpu(url: str, runs: int) -> float:
    """Median CPU of this process per scrape of ``url`` by the HTTP source (fetch + parse)."""
    source = HttpSource(discover_roles=False, fetch_model_info=False)
    endpoint = Endpoint(url, "server0")

    async def scrapes(n: int) -> float:
        t = time.process_time()
        for _ in range(n):
            [r] = await source.scrape_all([endpoint])
            assert r.ok, r.error
        return (time.process_time() - t) / n

    async def main() -> float:
        await scrapes(20)  # warm: connection, parser template
        figures = [await scrapes(40) for _ in range(runs)]
        await source.aclose()
        return statistics.median(figures)

    return asyncio.run(main())


class Child:
    """This script in a child process (``--serve`` / ``--write``), stopped on close."""

    def __init__(self, *args: str, multiproc_dir: str | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        if multiproc_dir is not None:
            env["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), *args], stdout=subprocess.PIPE, env=env, text=True
        )
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def serve(registry: CollectorRegistry) -> None:
    """Serve ``/metrics`` of ``registry`` on a free loopback port; print the URL; forever."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def child_main(args: argparse.Namespace) -> None:
    if args.write:  # PROMETHEUS_MULTIPROC_DIR is set: the values go to files
        build_registry(args.engines[0], CollectorRegistry())
        print("written", flush=True)
    elif args.serve_multiproc:
        reg = CollectorRegistry()
        _multiprocess_collector(reg, path=args.serve_multiproc)
        serve(reg)
    else:
        serve(build_registry(args.engines[0], with_process_collectors(CollectorRegistry())))


def with_process_collectors(reg: CollectorRegistry) -> CollectorRegistry:
    """What prometheus_client's default ``REGISTRY`` holds besides vLLM's families."""
    for c in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        reg.register(c)
    return reg


def measure(engines: int, runs: int) -> dict[str, float]:
    out: dict[str, float] = {}
    reg = build_registry(engines, with_process_collectors(CollectorRegistry()))
    source = InProcessSource(reg)
    out["inprocess_collect"] = per_call(lambda: list(reg.collect()), runs)
    out["inprocess"] = per_call(source.read, runs)
    out["http_render"] = per_call(lambda: generate_latest(reg), runs)
    server = Child("--serve", "--engines", str(engines))
    try:
        out["http_client"] = http_client_cpu(server.line, runs)
    finally:
        server.close()
    with tempfile.TemporaryDirectory(prefix="fsbench-mp-") as d:
        writer = Child("--write", "--engines", str(engines), multiproc_dir=d)
        assert writer.line == "written", writer.line
        writer.close()
        mp = MultiprocessSource(d)
        out["multiproc"] = per_call(mp.read, runs)
        mreg = CollectorRegistry()
        _multiprocess_collector(mreg, path=d)
        out["multiproc_http_render"] = per_call(lambda: generate_latest(mreg), runs)
        server = Child("--serve-multiproc", d)
        try:
            out["multiproc_http_client"] = http_client_cpu(server.line, runs)
        finally:
            server.close()
    expo = source.read()[0]
    assert sorted(expo) == [str(e) for e in range(engines)], list(expo)
    return {k: v / engines * 1e3 for k, v in out.items()}  # ms per engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--engines", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-multiproc", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve or args.write or args.serve_multiproc:
        child_main(args)
        return
    print(
        f"ms of CPU per engine, medians of {args.runs} rounds (load average "
        f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)"
    )
    head = (
        "engines",
        "in-process",
        "(collect)",
        "HTTP client",
        "+ server render",
        "multiproc",
        "HTTP client",
        "+ server render",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for n in args.engines:
        m = measure(n, args.runs)
        row = [
            m["inprocess"],
            m["inprocess_collect"],
            m["http_client"],
            m["http_render"],
            m["multiproc"],
            m["multiproc_http_client"],
            m["multiproc_http_render"],
        ]
        print(f"| {n} | " + " | ".join(f"{v:.3f}" for v in row) + " |", flush=True)


if __name__ == "__main__":
    main()
