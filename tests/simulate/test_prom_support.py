"""The Prometheus test oracle (tests/support/prom.py) against a real Prometheus server.

Two tiny "engines" (prometheus_client registries) are driven through frozen states;
Prometheus scrapes them, and its ``@``-modifier deltas and ``histogram_quantile`` must
equal what we did and what PromQL's interpolation rule gives by hand.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from support.prom import (
    PrometheusError,
    PrometheusNotFound,
    PrometheusServer,
    find_prometheus_binary,
    serve_registry,
)

BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0)
COUNTER = "fleettest:requests_total"  # ':' as in vLLM's "vllm:..." names
BUCKET = "fleettest:latency_seconds_bucket"


def promql_histogram_quantile(q: float, cumulative: list[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile on classic buckets: [(upper bound `le`, cumulative count)]."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(cumulative)
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return math.nan
    total = buckets[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    b = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if b == len(buckets) - 1:  # in the +Inf bucket: the highest finite bound
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


class Engine:
    """A registry shaped like a (very) small vLLM: one counter and one histogram."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fleettest:requests", "Requests.", ["model_name"], registry=self.registry
        )
        self.latency = Histogram(
            "fleettest:latency_seconds",
            "Latency.",
            ["model_name"],
            buckets=BUCKETS,
            registry=self.registry,
        )


def test_oracle_counter_delta_and_histogram_quantile() -> None:
    started = time.monotonic()
    e0, e1 = Engine(), Engine()

    # State A (the baseline, which the @-deltas must cancel out).
    e0.requests.labels("m").inc(5)
    e1.requests.labels("m").inc(11)
    for _ in range(5):
        e0.latency.labels("m").observe(4.0)
    for _ in range(3):
        e1.latency.labels("m").observe(0.05)

    with (
        serve_registry(e0.registry) as s0,
        serve_registry(e1.registry) as s1,
        PrometheusServer([s0.target, s1.target], scrape_interval=0.5) as prom,
    ):
        assert prom.url.startswith("http://127.0.0.1:")
        assert prom.port not in (9090, 9100)
        tmpdir = prom.tmpdir

        t1 = prom.wait_for_scrape_after(time.time(), timeout=20)

        # State B.
        e0.requests.labels("m").inc(3)
        e0.requests.labels("other").inc(2)
        e1.requests.labels("m").inc(4)
        for v in (0.05, 0.3, 0.3, 0.7, 0.7):
            e0.latency.labels("m").observe(v)
        for v in (0.05, 0.3, 0.7, 0.7, 2.0):
            e1.latency.labels("m").observe(v)

        t2 = prom.wait_for_scrape_after(time.time(), timeout=10)
        assert t2 > t1

        # State C, right away: queries pinned with @ must not see it.
        e0.requests.labels("m").inc(100)
        e1.latency.labels("m").observe(0.01)
        t3 = prom.wait_for_scrape_after(time.time(), timeout=10)
        assert t3 > t2

        # Frozen states, exactly.
        assert prom.query_value(f"sum({COUNTER} {prom.at(t1)})") == 16
        assert prom.query_value(f"sum({COUNTER} {prom.at(t2)})") == 25
        assert prom.query_value(f"sum({COUNTER} @ {t3})") == 125
        per_instance = {
            r["metric"]["instance"]: r["value"]
            for r in prom.query(f"sum by (instance) ({COUNTER} @ {t2})")
        }
        assert per_instance == {s0.target: 10, s1.target: 15}

        # Counter delta between the frozen states == what we incremented in between.
        delta = prom.query_value(f"sum({COUNTER} @ {t2}) - sum({COUNTER} @ {t1})")
        assert delta == 3 + 2 + 4

        # histogram_quantile over @-bucket deltas == PromQL's rule computed by hand.
        # Observations between t1 and t2: 0.05 x2, 0.3 x3, 0.7 x4, 2.0 x1 (10 in all).
        le = dict.fromkeys((*BUCKETS, math.inf), 0.0)
        for v in (0.05, 0.3, 0.3, 0.7, 0.7, 0.05, 0.3, 0.7, 0.7, 2.0):
            for bound in le:
                if v <= bound:
                    le[bound] += 1
        assert list(le.values()) == [2, 5, 9, 10, 10, 10]
        by_hand = {0.1: 0.05, 0.5: 0.5, 0.75: 0.8125, 0.9: 1.0, 0.99: 2.35}
        for q, expected in by_hand.items():
            assert promql_histogram_quantile(q, list(le.items())) == pytest.approx(expected)
            got = prom.query_value(
                f"histogram_quantile({q}, sum by (le) ({BUCKET} @ {t2} - {BUCKET} @ {t1}))"
            )
            assert got == pytest.approx(expected, rel=1e-12, abs=1e-12), q

        # The stored scrape timestamps: @ t1/@ t2 read exactly stored scrapes.
        times = prom.scrape_times()
        assert set(times) == {s0.target, s1.target}
        all_times = {t for ts in times.values() for t in ts}
        assert {t1, t2, t3} <= all_times
        for ts in times.values():
            assert ts == sorted(set(ts))
            assert 0.3 <= statistics.median(b - a for a, b in itertools.pairwise(ts)) <= 1.0

        # The targets API agrees that both targets are healthy.
        health = {t["labels"]["instance"]: t["health"] for t in prom.targets_status()}
        assert health == {s0.target: "up", s1.target: "up"}

        # Bad queries are loud errors, not empty results.
        with pytest.raises(PrometheusError, match="parse error"):
            prom.query("sum(")
        with pytest.raises(PrometheusError, match="0 samples"):
            prom.query_value("fleettest:no_such_metric")

        url = prom.url
        assert tmpdir.is_dir()

    # Stopped and cleaned up.
    assert not Path(tmpdir).exists()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/-/ready", timeout=1.0)
    assert time.monotonic() - started < 30


def test_wait_for_scrape_after_times_out_on_down_target() -> None:
    with serve_registry(CollectorRegistry()) as s:
        dead = s.target  # bound, then closed: nothing listens there any more
    with (
        PrometheusServer([dead], scrape_interval=0.5) as prom,
        pytest.raises(PrometheusError, match="not every target was scraped"),
    ):
        prom.wait_for_scrape_after(time.time(), timeout=1.0)


def test_missing_binary_fails_loudly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(PrometheusNotFound, match="apt-get install -y prometheus"):
        PrometheusServer(["127.0.0.1:1"], binary=str(tmp_path / "prometheus")).start()
    monkeypatch.setenv("FLEETSCOPE_PROMETHEUS_BIN", str(tmp_path / "nope"))
    with pytest.raises(PrometheusNotFound):
        find_prometheus_binary()
    monkeypatch.delenv("FLEETSCOPE_PROMETHEUS_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PrometheusNotFound, match="not found on PATH"):
        find_prometheus_binary()


def test_prometheus_is_installed() -> None:
    """The oracle must be there: CI installs Debian's prometheus (.ci/run)."""
    assert os.access(find_prometheus_binary(), os.X_OK)
