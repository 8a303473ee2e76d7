"""``InProcessSource``: engines in this process, read through the registry's ``collect()``.

* the registry read directly gives the snapshots a scrape of the same registry over HTTP gives
  (``generate_latest`` served on loopback, read by the HTTP source), and a collector on each
  logs the same keys every poll, in a window and in the run summary (values too, except those
  that depend on when each one read);
* several engines of one registry (vLLM's ``engine`` label) stay separate engines;
* the registry is read in the source's worker thread, never on the caller's event loop;
* a registry with no engine yet, or one whose collector raises, is a failed scrape with a
  warning naming the source, never an exception; the engine's later appearance is read.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector as PromCollector

import fleetscope as fs
from fleetscope.collector.core import Collector
from fleetscope.exposition import Exposition, parse
from fleetscope.sources.http.source import HttpSource
from fleetscope.sources.inprocess import InProcessSource
from fleetscope_sim import SimFleet
from support.loopback import LoopbackServer

# keys whose values depend on the moment each collector read (rates, time weights, latencies)
CLOCK = re.compile(r":rate|latency_seconds|poll_seconds|active_seconds")
EXACT = re.compile(r"/delta$|/p50$|/p90$|/p99$|engines_reporting$|coverage$|polls$")


def _same_snapshots(a: Exposition, b: Exposition) -> None:
    assert list(a) == list(b)
    for label in a:
        sa, sb = a[label], b[label]
        assert sa.layout.slot_ids == sb.layout.slot_ids, label
        np.testing.assert_array_equal(sa.data, sb.data)
    assert (a.endpoint is None) == (b.endpoint is None)
    if a.endpoint is not None and b.endpoint is not None:
        assert a.endpoint.layout.slot_ids == b.endpoint.layout.slot_ids
        np.testing.assert_array_equal(a.endpoint.data, b.endpoint.data)


async def test_the_registry_read_directly_equals_its_scrape_over_http() -> None:
    """A simulated vLLM 0.32 server's registry (two DP engines, every family vLLM exports, the
    process and Python families too): read with ``collect()`` or served as text and scraped."""
    fleet = SimFleet.build(1, dp=2, seed=7)
    fleet.step(5.0)
    ep = fleet.endpoints[0]
    source = InProcessSource(ep.registry, keep=None)  # every family, as the HTTP body has
    [first] = await source.scrape()
    assert first.ok and first.engine_kind == "vllm" and first.error is None
    assert first.exposition is not None
    _same_snapshots(first.exposition, parse(generate_latest(ep.registry)))
    fleet.step(5.0)
    [second] = await source.scrape()  # the same shape: the writer's and the parser's fast paths
    assert second.exposition is not None
    _same_snapshots(second.exposition, parse(generate_latest(ep.registry)))
    await source.aclose()


class _Odd(PromCollector):
    """Families generate_latest writes in its own ways: a sample timestamp, a name and a label
    outside the legacy character set, an int value, an untyped family, a summary."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            SummaryMetricFamily,
            UnknownMetricFamily,
        )

        c = CounterMetricFamily("vllm:stamped", "Stamped.", labels=["engine", "odd.label"])
        c.add_metric(["0", 'a "quoted"\nvalue'], 5, timestamp=1234.5)
        yield c
        odd = CounterMetricFamily("vllm:odd-name", "Odd.", labels=["engine"])
        odd.add_metric(["0"], 7)
        yield odd
        u = UnknownMetricFamily("vllm:untyped_thing", "Untyped.", labels=["engine"])
        u.add_metric(["0"], 2)
        yield u
        s = SummaryMetricFamily("vllm:a_summary", "A summary.", labels=["engine"])
        s.add_metric(["0"], count_value=3, sum_value=1.5)
        yield s


def test_lines_equal_generate_latest_for_every_family_kind() -> None:
    """Info, Enum (a state set), a summary, timestamps, escaping: the lines parse to the
    snapshots of ``generate_latest``'s body."""
    from prometheus_client import Enum, Info, Summary

    from fleetscope.sources.families import LineWriter, family_lines

    reg = CollectorRegistry()
    tokens, ttft, running = _vllm_metrics(reg)
    tokens.labels("m", "0").inc(3)
    ttft.labels("m", "0").observe(0.2)
    running.labels("m", "0").set(1)
    Info("vllm:build", "Build.", ["engine"], registry=reg).labels("0").info({"version": "x"})
    state = Enum("vllm:state", "State.", ["engine"], states=["a", "b"], registry=reg)
    state.labels("0").state("b")
    Summary("vllm:latency", "Latency.", ["engine"], registry=reg).labels("0").observe(0.5)
    reg.register(_Odd())
    writer = LineWriter()
    for _ in range(2):  # the second time from the writer's kept heads
        lines = family_lines(reg.collect(), None, writer)
        _same_snapshots(parse("\n".join(lines) + "\n"), parse(generate_latest(reg)))
    assert any(" 1234500" in line for line in lines)  # the timestamp, in milliseconds


async def test_keys_windows_and_summary_equal_the_http_source() -> None:
    fleet = SimFleet.build(1, dp=2, seed=11)
    fleet.step(5.0)
    ep = fleet.endpoints[0]
    with LoopbackServer({"/metrics": lambda _r: generate_latest(ep.registry)}) as server:
        http = HttpSource([server.url], discover_roles=False, fetch_model_info=False)
        ours = Collector(source=InProcessSource(ep.registry), interval=3600)
        theirs = Collector(source=http, interval=3600)
        views = [(await ours.poll(), await theirs.poll())]
        w_ours, w_theirs = ours.window("train"), theirs.window("train")
        await w_ours.astart()
        await w_theirs.astart()
        for _ in range(2):
            fleet.step(5.0)
            views.append((await ours.poll(), await theirs.poll()))
        fleet.step(5.0)
        windows = (await w_ours.astop(), await w_theirs.astop())
        summaries = (ours.summary(), theirs.summary())
        await ours.stop()
        await theirs.stop()
    for a, b in views:
        assert set(a.keys) == set(b.keys)
        assert set(a.engines) == set(b.engines) == {"server0.0", "server0.1"}
        differ = [k for k in a.keys if a.keys[k] != b.keys[k] and not CLOCK.search(k)]
        assert differ == [], differ[:10]
    exact = _exactly_equal(*windows) + _exactly_equal(*summaries)
    assert exact > 200
    assert windows[0]["inference/train/agg/generation_tokens_total/delta"] > 0


def _exactly_equal(a: Mapping[str, object], b: Mapping[str, object]) -> int:
    """Same keys; the values of the clock-free ones equal. Returns how many were compared."""
    assert set(a) == set(b)
    exact = [k for k in a if EXACT.search(k)]
    assert [k for k in exact if a[k] != b[k]] == []
    return len(exact)


def _vllm_metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram, Gauge]:
    labels = ["model_name", "engine"]
    tokens = Counter("vllm:generation_tokens", "Generation tokens.", labels, registry=registry)
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "TTFT.",
        labels,
        buckets=[0.01, 0.1, 1.0, 10.0],
        registry=registry,
    )
    running = Gauge("vllm:num_requests_running", "Running.", labels, registry=registry)
    return tokens, ttft, running


async def test_engines_of_one_registry_stay_separate() -> None:
    reg = CollectorRegistry()
    tokens, ttft, running = _vllm_metrics(reg)
    for engine in ("0", "1"):
        tokens.labels("m", engine).inc(1)  # every series exists before the baseline
        ttft.labels("m", engine).observe(0.05)
        running.labels("m", engine).set(0)
    collector = Collector(source=fs.InProcessSource(reg, name="trainer"), interval=3600)
    await collector.poll()
    tokens.labels("m", "0").inc(100)
    tokens.labels("m", "1").inc(7)
    ttft.labels("m", "1").observe(0.5)
    running.labels("m", "0").set(3)
    view = await collector.poll()
    await collector.stop()
    k = view.keys
    assert set(view.engines) == {"trainer.0", "trainer.1"}
    assert k["inference/trainer.0/generation_tokens_total"] == 1 + 100  # per engine: verbatim
    assert k["inference/trainer.1/generation_tokens_total"] == 1 + 7
    assert k["inference/trainer.1/time_to_first_token_seconds_count"] == 2
    assert k["inference/agg/generation_tokens_total/delta"] == 107
    assert k["inference/agg/time_to_first_token_seconds/delta"] == 1
    assert view.engines["trainer.0"].running == 3 and view.engines["trainer.1"].running == 0


class _Recording(PromCollector):
    """Adds nothing; notes the thread each ``collect()`` runs in."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def collect(self) -> Iterable[Metric]:
        self.threads.append(threading.current_thread())
        return []


async def test_the_registry_is_read_off_the_event_loop() -> None:
    reg = CollectorRegistry()
    _vllm_metrics(reg)[0].labels("m", "0").inc(1)
    spy = _Recording()
    reg.register(spy)
    source = InProcessSource(reg)
    for _ in range(3):
        [r] = await source.scrape()
        assert r.ok, r.error
    await source.aclose()
    loop_thread = threading.current_thread()
    assert len(spy.threads) == 3 and loop_thread not in spy.threads
    assert {t.name.split("_")[0] for t in spy.threads} == {"fleetscope-inprocess"}


class _Broken(PromCollector):
    def collect(self) -> Iterator[Metric]:
        raise RuntimeError("a collector that fails")


async def test_no_engine_yet_and_a_failing_registry_are_failed_scrapes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = CollectorRegistry()
    source = InProcessSource(reg, name="local", warn_interval=0.0)
    caplog.set_level(logging.WARNING, logger="fleetscope")
    [empty] = await source.scrape()
    assert not empty.ok and empty.error is not None
    assert "no vllm: or sglang: families" in empty.error
    assert "disable_log_stats=False" in caplog.text and "local" in caplog.text

    tokens = _vllm_metrics(reg)[0]  # the engine appears
    tokens.labels("m", "0").inc(5)
    [r] = await source.scrape()
    assert r.ok and r.exposition is not None and list(r.exposition) == ["0"]

    broken = _Broken()
    reg.register(broken)
    [failed] = await source.scrape()
    assert not failed.ok and failed.error is not None
    assert "a collector that fails" in failed.error
    reg.unregister(broken)
    [again] = await source.scrape()
    assert again.ok
    await source.aclose()
    [closed] = await source.scrape()
    assert not closed.ok


async def test_the_default_registry_and_the_process_start_time() -> None:
    """``registry=None`` reads prometheus_client's ``REGISTRY`` (vLLM's, in its process); the
    process start time comes along (restarts, windows), the rest of the process's families do
    not (``keep=None`` keeps them)."""
    from prometheus_client import REGISTRY

    tokens = Counter("vllm:test_inprocess_tokens", "For this test.", ["engine"])
    try:
        tokens.labels("0").inc(3)
        source = InProcessSource()
        assert source.registry is REGISTRY
        [r] = await source.scrape()
        assert r.ok and r.exposition is not None
        snap = r.exposition["0"]
        assert snap.process_start is not None and snap.process_start > 0
        assert all(t.startswith(("vllm:", "process_start")) for t in r.exposition.types)
        await source.aclose()
        every = InProcessSource(keep=None)
        [everything] = await every.scrape()
        await every.aclose()
        assert everything.exposition is not None
        assert any(t.startswith("python_") for t in everything.exposition.types)
    finally:
        REGISTRY.unregister(tokens)


async def test_scrape_does_not_block_the_loop_while_a_collector_is_slow() -> None:
    """A registry read that takes a while (a big registry, a busy GIL) leaves the caller's loop
    free: a ticker keeps ticking while the read waits."""
    release = threading.Event()
    entered = threading.Event()

    class _Slow(PromCollector):
        def collect(self) -> Iterable[Metric]:
            entered.set()
            release.wait(60)
            return []

    reg = CollectorRegistry()
    _vllm_metrics(reg)[0].labels("m", "0").inc(1)
    reg.register(_Slow())
    source = InProcessSource(reg)
    task = asyncio.ensure_future(source.scrape())
    ticks = 0
    while not entered.is_set():
        await asyncio.sleep(0.01)
    for _ in range(5):  # the loop runs while the read is blocked in its thread
        await asyncio.sleep(0)
        ticks += 1
    assert not task.done()
    release.set()
    [r] = await task
    assert r.ok and ticks == 5
    await source.aclose()
