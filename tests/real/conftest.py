"""The real vLLM end-to-end scenario (``make test-real``), run once per session.

``scripts/real_vllm/run.py`` starts two real vLLM servers (a single engine, and
``--data-parallel-size 2``) and runs pytest on this folder with their URLs in
``FLEETSCOPE_REAL_SERVER0`` / ``FLEETSCOPE_REAL_SERVER1``. Without them the folder is not collected
(``make test`` never needs vLLM); asking for it explicitly without them fails with a hint.

The scenario, in order (nothing else talks to the servers meanwhile):

1. scrape both idle servers directly (the bodies are saved as test data);
2. start a real Prometheus scraping both (the PromQL oracle for quantiles);
3. fleetscope's first poll — the DP server is idle, in multiprocess mode: no gauges yet;
4. window ``load`` starts (a poll); Prometheus scrapes that frozen state (T1);
5. the load generator runs (mixed completions/chat, streamed or not, repeated ~300-token
   prompts); meanwhile fleetscope polls and the bodies under load are scraped;
6. wait until both servers' counters stop moving; Prometheus scrapes that frozen state (T2);
7. window ``load`` stops (a poll); the final bodies are scraped directly.

The tests then compare fleetscope's window keys with the load generator's own counts, with
counters read straight from the bodies, and with PromQL at T1/T2.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import httpx
import pytest

from real import bodies as B
from real.scenario import GROUP, KIND, WINDOW, RealRun

if TYPE_CHECKING:
    from real.rl_scenario import RLRun

ROOT = Path(__file__).resolve().parents[2]
LOADGEN = ROOT / "scripts" / "real_vllm" / "loadgen.py"
ENV_URLS = {"server0": "FLEETSCOPE_REAL_SERVER0", "server1": "FLEETSCOPE_REAL_SERVER1"}
ENV_OUT = "FLEETSCOPE_REAL_OUT"  # where to write the scraped bodies (default: a temp dir)
ENV_META = "FLEETSCOPE_REAL_META"  # JSON from the launcher: versions, server arguments
OPENMETRICS = "application/openmetrics-text;version=1.0.0"


def _have_servers() -> bool:
    return all(os.environ.get(v) for v in ENV_URLS.values())


def _explicitly_asked(config: pytest.Config) -> bool:
    here = Path(__file__).resolve().parent
    for arg in config.invocation_params.args:
        p = Path(str(arg).split("::")[0])
        p = (config.invocation_params.dir / p).resolve()
        if p == here or here in p.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # `make test` collects tests/: skip this folder quietly unless servers were given or the
    # folder was asked for by path (then the tests fail with a hint, below)
    if _have_servers() or _explicitly_asked(config):
        return None
    return collection_path.name.startswith("test_")


# ----------------------------------------------------------------------------- the scenario


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.name}: {record.getMessage()}")


async def _get(http: httpx.AsyncClient, url: str, accept: str) -> tuple[str, str]:
    r = await http.get(url.rstrip("/") + "/metrics", headers={"Accept": accept})
    r.raise_for_status()
    return r.text, r.headers.get("content-type", "")


def _settled_values(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every cumulative vllm: sample (counters, histogram parts): what must stop moving."""
    kinds = B.types(body)
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for s in B.samples(body):
        fam = s.name
        for suffix in ("_total", "_bucket", "_count", "_sum"):
            if fam.endswith(suffix) and fam[: -len(suffix)] in kinds:
                fam = fam[: -len(suffix)]
                break
        if s.name.startswith("vllm:") and kinds.get(fam) in ("counter", "histogram"):
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert out, "no cumulative vllm: samples found"
    return out


async def _scenario(run: RealRun, requests: int, concurrency: int) -> None:
    from fleetscope.collector.core import Collector
    from fleetscope.sources.http.source import ACCEPT, Endpoint

    clock = time.monotonic
    async with httpx.AsyncClient(timeout=30) as http:

        async def scrape_all(phase: str, accept: str = ACCEPT, suffix: str = "") -> None:
            got = await asyncio.gather(*(_get(http, u, accept) for u in run.urls.values()))
            for name, (text, ctype) in zip(run.urls, got, strict=True):
                run.bodies[(name, phase + suffix)] = text
                run.content_types[(name, phase + suffix)] = ctype

        # 1. idle bodies, before anything else touches the servers
        await scrape_all("idle")

        endpoints = [Endpoint(u, name, groups=(GROUP[name],)) for name, u in run.urls.items()]
        collector = Collector(endpoints, interval=3600, timeout=10)
        try:
            # 3. first poll: the DP server is idle (multiprocess mode: no gauges yet)
            run.first_view = await collector.poll()
            run.record(run.first_view)

            # 4. the window starts on a frozen state, which Prometheus then scrapes
            window = collector.window(WINDOW)
            await window.astart()
            assert collector.last is not None
            run.record(collector.last)
            t = time.time()
            run.t1 = await asyncio.to_thread(run.prom.wait_for_scrape_after, t, 60.0)

            # 5. the load, with polls and scrapes under load
            load_json = run.out_dir / "load.json"
            t0 = clock()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(LOADGEN),
                *[a for u in run.urls.values() for a in ("--url", u)],
                "--requests",
                str(requests),
                "--concurrency",
                str(concurrency),
                "--out",
                str(load_json),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            wait = asyncio.ensure_future(proc.communicate())
            # the body "under load" (the most engines busy, then the most requests running,
            # then one taken mid-load: generation under way, not yet at the load's end),
            # sampled every 0.25 s; fleetscope polls about every second meanwhile
            gen = "vllm:generation_tokens_total"
            taken: dict[str, list[tuple[tuple[int, float], float, str, str]]] = {}

            async def sample(name: str, url: str) -> None:
                while not wait.done():
                    text, ctype = await _get(http, url, ACCEPT)
                    per_engine = B.by_engine(text, "vllm:num_requests_running")
                    busy = (sum(v > 0 for v in per_engine.values()), sum(per_engine.values()))
                    taken.setdefault(name, []).append((busy, B.total(text, gen), text, ctype))
                    run.load_samples += 1
                    await asyncio.wait([wait], timeout=0.25)

            def keep_load_bodies() -> None:
                for name, samples in taken.items():
                    idle, last = B.total(run.bodies[(name, "idle")], gen), samples[-1][1]
                    _busy, _gen, text, ctype = max(
                        samples, key=lambda s: (s[0], idle < s[1] < last)
                    )
                    run.bodies[(name, "load")] = text
                    run.content_types[(name, "load")] = ctype

            samplers = [asyncio.ensure_future(sample(n, u)) for n, u in run.urls.items()]
            while not wait.done():
                run.record(await collector.poll())
                await asyncio.wait([wait], timeout=1.0)
            await asyncio.gather(*samplers)
            keep_load_bodies()
            _, err = wait.result()
            run.timings["load"] = clock() - t0
            if proc.returncode != 0 or not load_json.exists():
                raise RuntimeError(
                    f"load generator failed ({proc.returncode}):\n{err.decode()[-3000:]}"
                )
            run.load = json.loads(load_json.read_text())

            # 6. wait until the servers' counters settle (vLLM records a request's stats
            # just after the response is sent), then let Prometheus scrape that state
            t0 = clock()
            prev = None
            while True:
                got = await asyncio.gather(*(_get(http, u, ACCEPT) for u in run.urls.values()))
                now = [_settled_values(text) for text, _ in got]
                run.quiet_polls += 1
                done = sum(B.total(text, "vllm:request_success_total") for text, _ in got)
                idle = sum(B.total(text, "vllm:num_requests_running") for text, _ in got)
                if now == prev and idle == 0 and done >= run.load["total"]["ok"]:
                    break
                if clock() - t0 > 60:
                    raise RuntimeError("the servers' counters did not settle within 60 s")
                prev = now
                await asyncio.sleep(0.5)
            run.timings["settle"] = clock() - t0
            t = time.time()
            run.t2 = await asyncio.to_thread(run.prom.wait_for_scrape_after, t, 60.0)

            # 7. the window stops on that frozen state; the final bodies
            run.window_keys = await window.astop()
            assert collector.last is not None
            run.record(collector.last)
            await scrape_all("after")
            await scrape_all("after", accept=OPENMETRICS, suffix="_openmetrics")
            run.summary = collector.summary()
        finally:
            await collector.stop()


def _save(run: RealRun) -> None:
    run.out_dir.mkdir(parents=True, exist_ok=True)
    for (endpoint, phase), text in sorted(run.bodies.items()):
        if phase in ("idle", "load", "after"):
            (run.out_dir / f"{KIND[endpoint]}_{phase}.prom").write_text(text, encoding="utf-8")
    meta = json.loads(os.environ.get(ENV_META) or "{}")
    meta.update(
        {
            "scraped_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "endpoints": {name: {"kind": KIND[name], "url": run.urls[name]} for name in run.urls},
            "content_types": {
                f"{KIND[e]}_{p}": c for (e, p), c in sorted(run.content_types.items())
            },
            "load": {
                KIND[name]: run.load["servers"][u.rstrip("/")] for name, u in run.urls.items()
            },
            "load_seconds": run.load.get("seconds"),
        }
    )
    (run.out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def best_busy(run: RealRun) -> dict[str, dict[str, float]]:
    return {
        KIND[e]: B.by_engine(run.body(e, "load"), "vllm:num_requests_running")
        for e in run.urls
        if (e, "load") in run.bodies
    }


@pytest.fixture(scope="session")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRun]:
    if not _have_servers():
        pytest.fail(
            "these tests need two real vLLM servers: run `make test-real` "
            f"(or set {' and '.join(ENV_URLS.values())})",
            pytrace=False,
        )
    from support.prom import PrometheusServer

    urls = {name: os.environ[var].rstrip("/") for name, var in ENV_URLS.items()}
    targets = {name: urlparse(u).netloc for name, u in urls.items()}
    out = os.environ.get(ENV_OUT)
    out_dir = Path(out) if out else tmp_path_factory.mktemp("real-vllm")
    out_dir.mkdir(parents=True, exist_ok=True)
    requests = int(os.environ.get("FLEETSCOPE_REAL_REQUESTS", "48"))
    concurrency = int(os.environ.get("FLEETSCOPE_REAL_CONCURRENCY", "6"))

    capture = _Capture()
    logger = logging.getLogger("fleetscope")
    logger.addHandler(capture)
    t0 = time.monotonic()
    with PrometheusServer(list(targets.values()), scrape_interval=0.5) as prom:
        run = RealRun(urls=urls, targets=targets, prom=prom, out_dir=out_dir)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(_scenario(run, requests, concurrency))
        logger.removeHandler(capture)
        run.warnings = capture.messages + [
            f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}"
            for w in caught
            if "fleetscope" in w.filename
        ]
        run.timings["scenario"] = time.monotonic() - t0
        _save(run)
        print(
            "\nreal vLLM scenario: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in run.timings.items())
            + f"; load: {json.dumps(run.load.get('total', {}), default=str)[:400]}"
            + f"; bodies in {out_dir} (load bodies: running {best_busy(run)} of "
            + f"{run.load_samples} direct scrapes)\n"
            + "fleetscope polls (running, waiting, generation tok/s per engine):\n"
            + run.table()
        )
        yield run


@pytest.fixture(scope="session")
def real_rl(real_run: RealRun) -> RLRun:
    """The RL phase (tests/real/rl_scenario.py), after the main scenario, with its Prometheus."""
    from real.rl_scenario import WINDOW, rl_scenario

    t0 = time.monotonic()
    rl = asyncio.run(rl_scenario(real_run.urls, real_run.prom, real_run.out_dir))
    print(
        f"\nreal vLLM RL phase: {time.monotonic() - t0:.1f} s; {len(rl.views)} polls "
        f"({len(rl.phase('settle'))} settling); window {WINDOW}: "
        + ", ".join(
            f"{k} {rl.window.get(f'inference/{WINDOW}/rl/{k}')}"
            for k in (
                "generation_tokens",
                "stale_generation_tokens",
                "unknown_version_generation_tokens",
                "max_version_lag",
            )
        )
        + "; calls: "
        + ", ".join(f"{c.server} {c.method} {c.path} {c.status}" for c in rl.calls)
    )
    return rl


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not _have_servers():
        return []
    return [f"real vLLM: {name}={os.environ[v]}" for name, v in ENV_URLS.items()] + (
        [f"prometheus: {shutil.which('prometheus')}"]
    )
