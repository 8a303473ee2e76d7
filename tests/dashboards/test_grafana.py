"""The Grafana dashboard: its JSON model, and every PromQL query in it run by a real Prometheus.

Two Prometheus servers scrape the same simulated fleet (a colocated server, a prefill and a
decode endpoint, 2 engines each; ``role`` set on the prefill/decode targets):

* ``text``: the fleet's own HTTP server, which always answers in the classic text format, so
  Prometheus stores ``vllm:...`` names;
* ``om``: the same endpoints' registries served by prometheus_client, which answers
  Prometheus's OpenMetrics request and (prometheus_client issue #1177) rewrites ``vllm:x`` to
  ``vllm_x`` in sample names, as a real vLLM behind Prometheus 2.42 is stored.

Every expression of the default dashboard (matching both spellings) must be accepted by both
and return at least one finite sample; the exact-prefix dashboards must work where their
spelling is stored.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetscope.cli import main as cli_main
from fleetscope.dashboards.grafana import (
    build_dashboard,
    promql_expressions,
    substitute_variables,
    variable_queries,
)
from fleetscope_sim import FleetServer, SimFleet
from support.prom import PrometheusServer, serve_registry

RATE = "5s"  # $__rate_interval for the checks: 10 scrapes at 0.5 s
PRIME_RL_PANELS = [
    "KV cache usage",
    "Preemptions / s",
    "Running requests",
    "Waiting requests",
    "Prefix cache hit rate",
    "Generation tokens / s",
    "Prompt tokens / s",
]


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def _panel(d: dict[str, Any], title: str) -> dict[str, Any]:
    (panel,) = [p for p in _panels(d) if p["title"] == title]
    return panel


def _exprs(panel: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


# ------------------------------------------------------------------------------ the model


def test_dashboard_model() -> None:
    d = build_dashboard()
    assert json.loads(json.dumps(d)) == d
    assert d["uid"] == "fleetscope-vllm-fleet" and d["title"] == "vLLM fleet (fleetscope)"
    assert [p["title"] for p in d["panels"] if p["type"] == "row"] == [
        "Fleet",
        "Latency",
        "Requests",
        "Scrape health",
        "RL loop",
        "SGLang",
    ]
    titles = [p["title"] for p in _panels(d)]
    assert titles[:7] == PRIME_RL_PANELS
    for title in (
        "Time to first token",
        "Time per output token (per request)",
        "Inter-token latency",
        "Truncation share",
        "Scrape targets up",
        "Engines reporting",
    ):
        assert title in titles
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids) and 0 not in ids
    for panel in _panels(d):
        assert panel["type"] == "timeseries"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["gridPos"]["w"] == 12 and panel["gridPos"]["h"] == 8
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs)
        for target in panel["targets"]:
            assert target["expr"] and target["legendFormat"]
            assert target["datasource"] == panel["datasource"]

    # aggregate + the tail that flags one sick engine (prime-rl's pairs)
    kv = _exprs(_panel(d, "KV cache usage"))
    assert [e.split(" ")[0] for e in kv] == ["avg", "min", "max"]
    for title, (agg, tail) in {
        "Preemptions / s": ("sum", "max"),
        "Generation tokens / s": ("sum", "min"),
        "Prompt tokens / s": ("sum", "max"),
    }.items():
        head, per_engine = _exprs(_panel(d, title))
        assert head.startswith(f"{agg} by (role) (rate(")
        assert per_engine.startswith(f"{tail} by (role) (sum by (role, instance, engine) (rate(")
    hit_pooled, hit_min = _exprs(_panel(d, "Prefix cache hit rate"))
    assert re.fullmatch(
        r"sum by \(role\) \(rate\(.*hits.*\)\) / sum by \(role\) \(rate\(.*\)\)", hit_pooled
    )
    assert hit_min.startswith("min by (role) (sum by (role, instance, engine)")
    # the decode minimum never includes prefill engines (prime-rl's pinned-at-0 defect)
    assert 'role!="prefill"' in _exprs(_panel(d, "Generation tokens / s"))[1]
    ttft = _exprs(_panel(d, "Time to first token"))
    assert ttft[0].startswith("histogram_quantile(0.5, sum by (le, role) (rate(")
    assert [e.split(",")[0] for e in ttft[:3]] == [
        "histogram_quantile(0.5",
        "histogram_quantile(0.9",
        "histogram_quantile(0.99",
    ]
    assert 'finished_reason="length"' in _exprs(_panel(d, "Truncation share"))[0]
    assert _exprs(_panel(d, "Scrape targets up"))[0].startswith("sum by (job, role) (up{")

    exprs = promql_expressions(d)
    assert len(exprs) == sum(len(p["targets"]) for p in _panels(d)) == 62
    for e in exprs:
        assert (
            '__name__=~"vllm[:_]' in e
            or e.split("(")[-1].startswith(("up{", "scrape_"))
            or ('__name__=~"sglang[:_]' in e)
        )
        assert "$__rate_interval" in e or "rate(" not in e

    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "role"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["multi"]
        assert variables[name]["allValue"] == ".*"  # "All" also matches targets without role
    assert variable_queries(d)["role"].endswith(", role)")
    (annotation,) = d["annotations"]["list"]
    assert annotation["target"]["tags"] == ["fleetscope"]
    assert annotation["datasource"]["type"] == "grafana"


def test_dashboard_options() -> None:
    d = build_dashboard(
        datasource="PROM1", metric_prefix="vllm:", role_label="tier", title="T", uid="u1"
    )
    assert d["title"] == "T" and d["uid"] == "u1"
    assert "datasource" not in {v["name"] for v in d["templating"]["list"]}
    assert {p["datasource"]["uid"] for p in _panels(d)} == {"PROM1"}
    exprs = promql_expressions(d)
    assert exprs[0] == 'avg by (tier) (vllm:kv_cache_usage_perc{job=~"$job",tier=~"$role"})'
    assert not any("__name__" in e for e in exprs)
    assert 'tier!="prefill"' in _exprs(_panel(d, "Generation tokens / s"))[1]
    assert variable_queries(d) == {
        "job": 'label_values({__name__=~"vllm:num_requests_running|sglang:num_running_reqs"}, job)',
        "role": (
            'label_values({__name__=~"vllm:num_requests_running|sglang:num_running_reqs",'
            'job=~"$job"}, tier)'
        ),
    }
    assert not build_dashboard(annotation_tags=()).get("annotations", {}).get("list")
    for bad in ({"metric_prefix": "vllm-"}, {"role_label": "job"}, {"role_label": "__role"}):
        with pytest.raises(ValueError):
            build_dashboard(**bad)


def test_substitute_variables() -> None:
    e = 'sum(rate(x{job=~"$job",role=~"${role}"}[$__rate_interval]))'
    assert substitute_variables(e, "30s") == 'sum(rate(x{job=~".*",role=~".*"}[30s]))'
    assert substitute_variables(e, variables={"role": "decode"}) == (
        'sum(rate(x{job=~".*",role=~"decode"}[1m]))'
    )


def test_cli_writes_dashboard(tmp_path: Path) -> None:
    out = tmp_path / "dash.json"
    argv = ["dashboard", "grafana", "--out", str(out), "--datasource", "abc", "--title", "X"]
    assert cli_main([*argv, "--metric-prefix", "vllm:"]) == 0
    written = json.loads(out.read_text())
    assert written == build_dashboard(datasource="abc", title="X", metric_prefix="vllm:")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli_main(["dashboard", "grafana"]) == 0
    assert json.loads(stdout.getvalue()) == build_dashboard()


# ------------------------------------------------------------------------------ real Prometheus


@dataclass
class Stack:
    text: PrometheusServer  # scrapes the fleet's own server: `vllm:` names
    om: PrometheusServer  # scrapes prometheus_client with OpenMetrics negotiation
    t_text: float  # evaluation times: every target scraped for >= 2.5 s before
    t_om: float

    def query(self, prom: PrometheusServer, expr: str, **variables: str) -> list[dict[str, Any]]:
        t = self.t_text if prom is self.text else self.t_om
        return prom.query(substitute_variables(expr, RATE, variables), t)


def _roles(targets: list[str]) -> dict[str, dict[str, str]]:
    # endpoint 0 is colocated (no role label), 1 is prefill, 2 is decode
    return {targets[1]: {"role": "prefill"}, targets[2]: {"role": "decode"}}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    fleet = SimFleet.build(3, dp=2, roles=[None, "prefill", "decode"], seed=7)
    fleet.run(5.0)  # some history: every histogram has observations
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(FleetServer(fleet, step_interval=0.1))
        text_targets = [url.split("//", 1)[1] for url in server.urls]
        om_servers = [
            stack.enter_context(serve_registry(ep.registry, force_text_format=False))
            for ep in fleet.endpoints
        ]
        om_targets = [m.target for m in om_servers]
        text = stack.enter_context(
            PrometheusServer(text_targets, 0.5, target_labels=_roles(text_targets))
        )
        om = stack.enter_context(
            PrometheusServer(om_targets, 0.5, target_labels=_roles(om_targets))
        )
        first_text = text.wait_for_scrape_after(time.time())
        first_om = om.wait_for_scrape_after(time.time())
        t_text = text.wait_for_scrape_after(first_text + 2.5)
        t_om = om.wait_for_scrape_after(first_om + 2.5)
        yield Stack(text, om, t_text, t_om)


def _stored_prefix(prom: PrometheusServer, t: float) -> str:
    names = {
        r["metric"]["__name__"][:5]
        for r in prom.query('{__name__=~"vllm.num_requests_running"}', t)
    }
    assert len(names) == 1, names
    prefix: str = names.pop()
    return prefix


#: rows whose series this fleet does not have (tests/dashboards/test_grafana_rl.py runs them)
OTHER_ROWS = ("RL loop", "SGLang")


def row_exprs(d: dict[str, Any]) -> dict[str, list[str]]:
    """Each row's PromQL, by row title (rows are flat: a row panel, then its panels)."""
    out: dict[str, list[str]] = {}
    row = ""
    for panel in d["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        else:
            out.setdefault(row, []).extend(_exprs(panel))
    return out


def core_exprs(d: dict[str, Any]) -> list[str]:
    return [e for row, es in row_exprs(d).items() if row not in OTHER_ROWS for e in es]


def _assert_all_return_data(stack: Stack, prom: PrometheusServer, d: dict[str, Any]) -> None:
    problems = []
    for expr in core_exprs(d):
        result = stack.query(prom, expr)  # PrometheusError if Prometheus rejects the query
        if not any(math.isfinite(r["value"]) for r in result):
            problems.append(f"{expr}\n  -> {result}")
    assert not problems, "queries without a finite sample:\n" + "\n".join(problems)


def test_names_as_stored(stack: Stack) -> None:
    """The naming surprise: the same registry is stored as `vllm:` or `vllm_`."""
    assert _stored_prefix(stack.text, stack.t_text) == "vllm:"
    om_prefix = _stored_prefix(stack.om, stack.t_om)
    assert om_prefix in ("vllm:", "vllm_")
    if om_prefix == "vllm_":  # Prometheus 2.42 + prometheus_client OpenMetrics
        exact_colon = build_dashboard(metric_prefix="vllm:")
        assert stack.query(stack.om, promql_expressions(exact_colon)[0]) == []


@pytest.mark.parametrize("server", ["text", "om"])
def test_every_default_expression_runs_and_returns_data(stack: Stack, server: str) -> None:
    _assert_all_return_data(stack, getattr(stack, server), build_dashboard())


def test_exact_prefix_dashboards(stack: Stack) -> None:
    _assert_all_return_data(stack, stack.text, build_dashboard(metric_prefix="vllm:"))
    om_prefix = _stored_prefix(stack.om, stack.t_om)
    _assert_all_return_data(stack, stack.om, build_dashboard(metric_prefix=om_prefix))


def test_role_awareness(stack: Stack) -> None:
    d = build_dashboard()
    prom = stack.text
    gen_sum, gen_min = _exprs(_panel(d, "Generation tokens / s"))

    # All roles: the minimum comes from colocated and decode engines only, never prefill
    mins = {r["metric"].get("role", ""): r["value"] for r in stack.query(prom, gen_min)}
    assert set(mins) == {"", "decode"}
    assert mins["decode"] > 0
    sums = {r["metric"].get("role", ""): r["value"] for r in stack.query(prom, gen_sum)}
    assert set(sums) == {"", "prefill", "decode"}
    # what the naive fleet-wide minimum would show: a prefill engine's rate, far below decode
    naive = stack.query(prom, f'min(rate(vllm:generation_tokens_total{{job="fleet"}}[{RATE}]))')
    assert naive[0]["value"] < 0.2 * mins["decode"]

    # $role=decode: every panel shows decode targets only
    for expr in core_exprs(d):
        result = stack.query(prom, expr, role="decode")
        assert result, expr
        assert {r["metric"].get("role") for r in result} == {"decode"}, expr
    # a multi-value selection, as Grafana formats it
    result = stack.query(prom, _exprs(_panel(d, "KV cache usage"))[0], role="(prefill|decode)")
    assert {r["metric"].get("role") for r in result} == {"prefill", "decode"}


def test_variable_queries_list_jobs_and_roles(stack: Stack) -> None:
    """``label_values(selector, label)`` as Grafana runs it: the series API with match[]."""
    client = httpx.Client(timeout=10, trust_env=False)
    for prom in (stack.text, stack.om):
        found = {}
        for name, query in variable_queries(build_dashboard()).items():
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
            assert m, query
            selector, label = substitute_variables(m.group(1)), m.group(2)
            r = client.get(f"{prom.url}/api/v1/label/{label}/values", params={"match[]": selector})
            assert r.status_code == 200 and r.json()["status"] == "success", r.text
            found[name] = sorted(r.json()["data"])
        assert found == {"job": ["fleet"], "role": ["decode", "prefill"]}
    client.close()
