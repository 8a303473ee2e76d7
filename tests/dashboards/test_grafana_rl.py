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
import time
from collections.abc import Iterator

import pytest
from test_grafana import OTHER_ROWS, row_exprs

from fleetscope.dashboards.grafana import (
    build_dashboard,
    promql_expressions,
    substitute_variables,
    variable_queries,
)
from support.loopback import LoopbackServer
from support.paths import DATA
from support.prom import PrometheusServer

RATE = "5s"
BODIES = {
    "vllm": DATA / "real-vllm-rl" / "single" / "41_final.prom",
    "sglang": DATA / "sglang-0.5.23" / "dp2_after.prom",
    # every scheduler rank exports (--enable-metrics-for-all-schedulers), and a prefill server
    "sglang_tp": DATA / "sglang-0.5.23" / "all_tp_ranks_after.prom",
    "sglang_prefill": DATA / "sglang-0.5.23" / "pd_prefill_after.prom",
}
TARGETS: list[str] = []  # the module's Prometheus targets (vLLM, SGLang)
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
        self.server = LoopbackServer({"/metrics": lambda request: grown(text, next(counter))})
        self.target = self.server.target

    def close(self) -> None:
        self.server.close()


@pytest.fixture(scope="module")
def prom() -> Iterator[tuple[PrometheusServer, float]]:
    servers = {k: Growing(p.read_text()) for k, p in BODIES.items()}
    try:
        targets = [s.target for s in servers.values()]
        TARGETS[:] = targets
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
def test_every_rl_and_sglang_expression_runs_and_returns_data(
    prom: tuple[PrometheusServer, float], prefix: str | None
) -> None:
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


def test_rl_figures_from_promql(prom: tuple[PrometheusServer, float]) -> None:
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


@pytest.mark.parametrize("prefix", [None, "vllm:"])
def test_the_job_and_role_variables_list_sglang_targets(
    prom: tuple[PrometheusServer, float], prefix: str | None
) -> None:
    """A job serving only SGLang is listed: the variables' probe matches both engines' series
    (here one job holds a vLLM and an SGLang target: the probe must match both instances)."""
    p, _ = prom
    instances = set()
    for name, query in variable_queries(build_dashboard(metric_prefix=prefix)).items():
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert m, query
        found = p.label_values("instance", substitute_variables(m.group(1)))
        if name == "job":
            instances = set(found)
    assert instances == set(TARGETS), instances


def test_every_queried_name_is_in_the_catalog() -> None:
    """Like vLLM's own dashboards' check: every engine series the dashboard queries is a
    family the catalog knows, for the engine it is queried as."""
    from fleetscope.catalog import family_of_series

    names = set()
    for expr in promql_expressions(build_dashboard(metric_prefix="vllm:")):
        names |= set(re.findall(r"\b((?:vllm|sglang):[a-zA-Z0-9_]+)", expr))
    assert any(n.startswith("sglang:") for n in names) and len(names) > 20
    unknown = sorted(n for n in names if family_of_series(n) is None)
    assert not unknown, unknown
    # a name the catalog lacks is refused at build time, not drawn as an empty panel
    from fleetscope.dashboards._grafana_promql import Promql

    with pytest.raises(ValueError, match="catalog"):
        Promql(None, "role", "job", "role").sel("num_requests_runnin")


def test_sglang_gauges_count_each_engine_once_and_split_by_engine_type(
    prom: tuple[PrometheusServer, float],
) -> None:
    """Rank repeats are not summed (rank 0 kept, as the parser keeps it) and SGLang's own
    ``engine_type`` splits the lines: the running-requests panel equals fleetscope's parse of
    the same bodies (whose rank rule is tested against SGLang's driven truth)."""
    from fleetscope.exposition import Parser

    p, t = prom
    rows = row_exprs(build_dashboard())["SGLang"]
    running = next(e for e in rows if "num_running_reqs" in e)
    got = {
        r["metric"]["engine_type"]: r["value"]
        for r in p.query(substitute_variables(running, RATE), t)
    }
    want: dict[str, float] = {}
    for key in ("sglang", "sglang_tp", "sglang_prefill"):
        expo = Parser().parse(BODIES[key].read_text())
        for label, snap in expo.items():
            role = expo.engine_roles.get(label, "unified")
            want[role] = want.get(role, 0.0) + snap["vllm:num_requests_running"]
    assert got == want and set(got) == {"unified", "prefill"}
    tp = Parser().parse(BODIES["sglang_tp"].read_text())
    assert 'tp_rank="1"' in BODIES["sglang_tp"].read_text() and len(tp) == 1
