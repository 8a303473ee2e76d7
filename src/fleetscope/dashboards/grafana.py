"""A Grafana dashboard, generated from code, for vLLM fleets scraped by Prometheus.

fleetscope computes its statistics from ``/metrics`` itself; this dashboard gives operators
the same view straight from a Prometheus server that already scrapes the engines. It is
built with Grafana's own builder library (``grafana-foundation-sdk``, the ``dashboards``
extra) and queries the raw ``vllm:`` series.

Panels (each pairs the fleet aggregate with the cross-engine tail that flags one sick
engine, as prime-rl's W&B workspace does):

* Fleet: KV cache usage (mean + min/max), preemptions/s (sum + max engine), running and
  waiting requests (mean + min/max), prefix cache hit rate (pooled + min engine), generation
  tokens/s (sum + min engine over *non-prefill* engines: prefill engines generate ~nothing and
  would pin the minimum at 0, hiding a stalled decode engine), prompt tokens/s (sum + max).
* Latency: TTFT, TPOT, ITL and end-to-end latency, p50/p90/p99 with
  ``histogram_quantile(q, sum by (le, role) (rate(x_bucket[$__rate_interval])))`` and the mean
  ``sum(rate(x_sum)) / sum(rate(x_count))`` (as vLLM's own dashboards compute them).
* Requests: truncation share (``finished_reason="length"`` over all finished), finished/s by
  reason.
* Scrape health: targets up / expected (``up``), engines reporting, scrape duration.

Roles. Every series is split ``by (role)`` where ``role`` is a label the user puts on the
scrape targets (``static_configs: [{targets: [...], labels: {role: decode}}]``; the name is
``role_label``). Colocated fleets without the label get one series per statistic; in
disaggregated runs prefill and decode get their own lines. ``$job`` and ``$role`` template
variables filter the targets.

Metric names. Prometheus >= 2.5 asks targets for OpenMetrics, and prometheus_client then
writes ``vllm:x`` as ``vllm_x`` (client_python issue #1177), so the same vLLM may be stored as
``vllm:num_requests_running`` or ``vllm_num_requests_running`` depending on versions. By
default (``metric_prefix=None``) every selector matches both:
``{__name__=~"vllm[:_]num_requests_running"}``. Pass ``metric_prefix="vllm:"`` (or
``"vllm_"``) for plain, exact names.

API::

    build_dashboard(*, title=..., uid=..., datasource=None, metric_prefix=None,
                    role_label="role", ...) -> dict        # Grafana dashboard JSON model
    promql_expressions(dashboard) -> list[str]             # every panel query, in order
    substitute_variables(expr, rate_interval="1m", variables=None) -> str   # concrete PromQL
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetscope import catalog
from fleetscope.dashboards._grafana_panels import panel_rows
from fleetscope.dashboards._grafana_promql import QUANTILES as QUANTILES
from fleetscope.dashboards._grafana_promql import RATE as RATE
from fleetscope.dashboards._grafana_promql import Promql, native_metric

__all__ = [
    "DEFAULT_TITLE",
    "DEFAULT_UID",
    "build_dashboard",
    "dashboard_json",
    "promql_expressions",
    "substitute_variables",
    "variable_queries",
    "write_dashboard",
]

DEFAULT_TITLE = "vLLM fleet (fleetscope)"
DEFAULT_UID = "fleetscope-vllm-fleet"

_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _import_sdk() -> Any:
    try:
        from grafana_foundation_sdk.builders import common, dashboard, prometheus, timeseries
        from grafana_foundation_sdk.cog.encoder import JSONEncoder
        from grafana_foundation_sdk.models import common as common_models
        from grafana_foundation_sdk.models import dashboard as dashboard_models
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            "the Grafana dashboard needs grafana-foundation-sdk: "
            "pip install 'fleetscope[dashboards]' (or pip install grafana-foundation-sdk)"
        ) from e

    @dataclass
    class Sdk:
        common: Any
        dashboard: Any
        prometheus: Any
        timeseries: Any
        JSONEncoder: Any
        common_models: Any
        dashboard_models: Any

    return Sdk(
        common, dashboard, prometheus, timeseries, JSONEncoder, common_models, dashboard_models
    )


# ---------------------------------------------------------------------------------- builder


def build_dashboard(
    *,
    title: str = DEFAULT_TITLE,
    uid: str = DEFAULT_UID,
    datasource: str | None = None,
    metric_prefix: str | None = None,
    role_label: str = "role",
    refresh: str = "30s",
    time_from: str = "now-1h",
    annotation_tags: Sequence[str] = ("fleetscope",),
    tags: Sequence[str] = ("vllm", "fleetscope"),
) -> dict[str, Any]:
    """The Grafana dashboard JSON model (a plain ``dict``, ready for ``json.dump``).

    Args:
        title, uid: dashboard title and uid.
        datasource: a Prometheus data source uid. ``None`` adds a ``$datasource`` variable
            (type prometheus) so the dashboard can be imported anywhere.
        metric_prefix: ``None`` matches ``vllm:x`` and ``vllm_x`` (see the module docs);
            ``"vllm:"`` / ``"vllm_"`` (any valid name prefix) selects exact names.
        role_label: the target label holding ``prefill`` / ``decode`` (absent = colocated).
        annotation_tags: Grafana annotations with these tags (as written by
            :class:`fleetscope.sinks.grafana.GrafanaAnnotator`) are shown on every panel;
            empty for none.
    """
    if metric_prefix is not None and not _NAME_RE.match(metric_prefix + "x"):
        raise ValueError(f"metric_prefix {metric_prefix!r} is not a valid metric name prefix")
    if not _LABEL_RE.match(role_label) or role_label.startswith("__"):
        raise ValueError(f"role_label {role_label!r} is not a valid label name")
    if role_label in ("job", "instance", "engine", "le", "finished_reason"):
        raise ValueError(f"role_label {role_label!r} clashes with a label the queries use")

    sdk = _import_sdk()
    db, dm = sdk.dashboard, sdk.dashboard_models
    cm = sdk.common_models

    if datasource is None:
        ds = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
    else:
        ds = dm.DataSourceRef(type_val="prometheus", uid=datasource)

    promql = Promql(metric_prefix, role_label, "job", "role")
    # variables list the jobs / roles that serve vLLM or SGLang, not every scrape job
    running = {e: native_metric(catalog.RUNNING, e) for e in ("vllm", "sglang")}
    job_probe = promql.any_engine(running)
    role_probe = promql.any_engine(running, 'job=~"$job"')
    builder = (
        db.Dashboard(title)
        .uid(uid)
        .tags(list(tags))
        .refresh(refresh)
        .time(time_from, "now")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .editable()
    )
    if datasource is None:
        builder = builder.with_variable(
            db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
    builder = builder.with_variable(
        db.QueryVariable("job")
        .label("job")
        .datasource(ds)
        .query(f"label_values({job_probe}, job)")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    ).with_variable(
        db.QueryVariable("role")
        .label(role_label)
        .description(
            f"Target label {role_label!r} (prefill / decode); colocated targets have none."
        )
        .datasource(ds)
        .query(f"label_values({role_probe}, {role_label})")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    )
    if annotation_tags:
        builder = builder.annotation(
            db.AnnotationQuery()
            .name("fleetscope runs and windows")
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .target(
                db.AnnotationTarget()
                .type("tags")
                .tags(list(annotation_tags))
                .match_any(False)
                .limit(100)
            )
        )

    panel_id = 0
    for row_title, specs in panel_rows(promql):
        panel_id += 1
        builder = builder.with_row(db.Row(row_title).id(panel_id))
        for spec in specs:
            panel_id += 1
            panel = (
                sdk.timeseries.Panel()
                .id(panel_id)
                .title(spec.title)
                .description(spec.description)
                .datasource(ds)
                .unit(spec.unit)
                .min(0)
                .height(8)
                .span(12)
                .line_width(1)
                .fill_opacity(0)
                .legend(
                    sdk.common.VizLegendOptions()
                    .show_legend(True)
                    .display_mode(cm.LegendDisplayMode.LIST)
                    .placement(cm.LegendPlacement.BOTTOM)
                )
                .tooltip(
                    sdk.common.VizTooltipOptions()
                    .mode(cm.TooltipDisplayMode.MULTI)
                    .sort(cm.SortOrder.DESCENDING)
                )
            )
            if spec.max is not None:
                panel = panel.max(spec.max)
            for i, q in enumerate(spec.queries):
                panel = panel.with_target(
                    sdk.prometheus.Dataquery()
                    .expr(q.expr)
                    .legend_format(q.legend)
                    .ref_id(chr(ord("A") + i))
                    .range()
                    .datasource(ds)
                )
            builder = builder.with_panel(panel)

    model: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=sdk.JSONEncoder))
    return model


def dashboard_json(**kwargs: Any) -> str:
    """:func:`build_dashboard` serialized (indented, trailing newline)."""
    return json.dumps(build_dashboard(**kwargs), indent=2) + "\n"


def write_dashboard(path: str | Path, **kwargs: Any) -> Path:
    """Write :func:`build_dashboard` ``(**kwargs)`` to ``path``; returns the path."""
    out = Path(path)
    out.write_text(dashboard_json(**kwargs), encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------- reading


def _walk_panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels") or [])


def promql_expressions(dashboard: Mapping[str, Any]) -> list[str]:
    """Every panel query's PromQL (``targets[].expr``), in dashboard order, rows included.

    Grafana variables (``$__rate_interval``, ``$job``...) are left in; see
    :func:`substitute_variables`.
    """
    out = []
    for panel in _walk_panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if expr:
                out.append(str(expr))
    return out


def variable_queries(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """``{variable name: query}`` of the dashboard's query variables (``label_values(...)``)."""
    out = {}
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("type") == "query":
            query = var.get("query")
            if isinstance(query, Mapping):
                query = query.get("query")
            out[str(var["name"])] = str(query)
    return out


_VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute_variables(
    expr: str, rate_interval: str = "1m", variables: Mapping[str, str] | None = None
) -> str:
    """Replace Grafana variables by concrete values, as Grafana would before querying.

    ``$__rate_interval``, ``$__interval`` and ``$__range`` become ``rate_interval``; other
    variables take ``variables[name]``, default ``.*`` (the dashboard's "All").
    """
    values = {
        "__rate_interval": rate_interval,
        "__interval": rate_interval,
        "__range": rate_interval,
        **(variables or {}),
    }

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, ".*")

    return _VAR_RE.sub(repl, expr)
