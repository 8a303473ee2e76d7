"""The Grafana dashboard's "RL loop" and "SGLang" rows against a real Prometheus.

Two targets serve real bodies whose cumulative samples grow at every scrape (each counter,
bucket, ``_count`` and ``_sum`` multiplied by the scrape number: still valid, monotonic
histograms, so rates and quantiles have data): a real vLLM 0.32 CPU body recorded after the RL
and sleep calls (``tests/data/real-vllm-rl/single/41_final.prom``: every RL and sleep-mode
family, ``engine_sleep_state``) and a real SGLang 0.5.23 DP=2 body. Every expression of the two
rows must be accepted by Prometheus and return a finite sample, for the default dashboard
(both spellings) and for the exact ``vllm:`` prefix (``sglang:`` follows it).
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_grafana import OTHER_ROWS, row_exprs

from conftest import DATA
from fleetscope.dashboards.grafana import build_dashboard, substitute_variables
from support.prom import PrometheusServer

RATE = "5s"
BODIES = {
    "vllm": DATA / "real-vllm-rl" / "single" / "41_final.prom",
    "sglang": DATA / "sglang-0.5.23" / "dp2_after.prom",
}
_CUMULATIVE = re.compile(r"^(\S+?(?:_total|_count|_bucket|_sum)(?:\{.*\})?) (\S+)$")


def grown(text: str, n: int) -> str:
    """``text`` with every cumulative sample multiplied by ``n`` (``_created`` kept)."""
    out = []
    for line in text.splitlines():
        m = _CUMULATIVE.match(line)
        if m and not line.startswith("#"):
            line = f"{m.group(1)} {float(m.group(2)) * n!r}"
        out.append(line)
    return "\n".join(out) + "\n"


class Growing:
    """A loopback server answering ``/metrics`` with ``grown(body, scrape number)``."""

    def __init__(self, text: str) -> None:
        counter = itertools.count(1)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = grown(text, next(counter)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def prom() -> Iterator[tuple[PrometheusServer, float]]:
    servers = {k: Growing(p.read_text()) for k, p in BODIES.items()}
    try:
        targets = [s.target for s in servers.values()]
        with PrometheusServer(targets, 0.5) as p:
            first = p.wait_for_scrape_after(time.time())
            t = p.wait_for_scrape_after(first + 2.5)
            yield p, t
    finally:
        for s in servers.values():
            s.close()


def test_grown_bodies_stay_valid() -> None:
    from fleetscope.exposition import Parser

    for path in BODIES.values():
        parser = Parser()
        a = parser.parse(grown(path.read_text(), 1), time=0.0)
        b = parser.parse(grown(path.read_text(), 3), time=1.0)
        assert set(a) == set(b) and not b.invalid


@pytest.mark.parametrize("prefix", [None, "vllm:"])
def test_every_rl_and_sglang_expression_runs_and_returns_data(prom, prefix) -> None:
    p, t = prom
    rows = row_exprs(build_dashboard(metric_prefix=prefix))
    assert set(OTHER_ROWS) <= set(rows)
    problems = []
    for row in OTHER_ROWS:
        assert len(rows[row]) >= 8, row
        for expr in rows[row]:
            result = p.query(substitute_variables(expr, RATE), t)  # raises if rejected
            if not any(math.isfinite(r["value"]) for r in result):
                problems.append(f"{expr}\n  -> {result}")
    assert not problems, "queries without a finite sample:\n" + "\n".join(problems)


def test_rl_figures_from_promql(prom) -> None:
    """The weight-update calls per operation and the engines asleep, as PromQL sees them."""
    p, t = prom
    rows = row_exprs(build_dashboard())["RL loop"]
    calls = next(
        e for e in rows if e.startswith("sum by (operation, role) (rate(") and "_count" in e
    )
    got = {
        r["metric"]["operation"]: r["value"] for r in p.query(substitute_variables(calls, RATE), t)
    }
    assert {"init", "start", "update", "finish", "shutdown"} <= set(got)
    assert all(v > 0 for v in got.values())
    asleep = next(e for e in rows if "avg_over_time" in e)
    (r,) = p.query(substitute_variables(asleep, RATE), t)
    assert r["value"] == 0.0  # the recorded body is awake (awake = 1 at every scrape)
