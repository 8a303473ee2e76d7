"""Prometheus rules generated from the catalog and fleetscope's health thresholds: alerting rules
for every health condition an exposition can show, recording rules for the fleet figures, and
SLO burn-rate alerts (``fleetscope alerts``; docs/alerts.md).

Three groups:

* ``fleetscope-health`` (evaluated every scrape interval): one series per engine for vLLM and
  SGLang alike (:mod:`._alert_promql`), and the alerts FleetscopeGenerationStalled,
  FleetscopeKvCacheNearFull, FleetscopeQueueGrowing, FleetscopePreemptionBurst,
  FleetscopeEngineOutlier, FleetscopeTargetDown and, for vLLM, FleetscopeEngineAsleep, with the
  thresholds and meaning of :class:`~fleetscope.health.HealthMonitor` (:mod:`._alert_health`).
  Labels: ``engine``, ``instance``, ``job``, the role label, ``severity``, ``condition`` (the
  fleetscope condition's name).
* ``fleetscope-fleet``: pooled latency quantiles, prefix hit rate and token rates per role
  (:mod:`._alert_fleet`).
* ``fleetscope-slo`` (only with objectives): error ratios and multiwindow burn-rate alerts
  (:mod:`._alert_slo`).

Every family and label a rule reads is checked against the catalog for the targeted engine
versions: a name an engine does not expose is a :class:`RuleError`, not a silent rule.

API::

    AlertOptions(thresholds=HealthThresholds(), versions=DEFAULT_VERSIONS, scrape_interval=15,
                 rate_window=300, metric_prefix=None, role_label="role", slos=())
    rule_groups(options) -> list[dict]          # the groups, as plain data
    rules_yaml(options, format="rules" | "prometheusrule", name=..., namespace=..., labels=...)
    parse_slo("ttft:0.99<2.5s") -> Slo          # slo_problem(slo, options.target) -> str | None
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetscope import catalog
from fleetscope.dashboards._alert_fleet import fleet_rules
from fleetscope.dashboards._alert_health import ALERTS, DIFFERENCES, AlertDoc, HealthRules
from fleetscope.dashboards._alert_promql import ENGINE_KINDS, RuleError, Target, duration
from fleetscope.dashboards._alert_slo import ALERT as SLO_ALERT
from fleetscope.dashboards._alert_slo import DOC as SLO_DOC
from fleetscope.dashboards._alert_slo import SLIS, Slo, parse_slo, slo_problem, slo_rules
from fleetscope.dashboards._alert_yaml import dump
from fleetscope.health import HealthThresholds

__all__ = [
    "ALERTS",
    "DEFAULT_VERSIONS",
    "DIFFERENCES",
    "ENGINE_KINDS",
    "SLIS",
    "SLO_ALERT",
    "SLO_DOC",
    "AlertDoc",
    "AlertOptions",
    "RuleError",
    "Slo",
    "alert_names",
    "parse_slo",
    "rule_groups",
    "rules_yaml",
    "slo_problem",
]

#: the versions rules target by default: the newest the catalog was checked against
DEFAULT_VERSIONS: dict[str, str] = {e: v[-1] for e, v in catalog.CHECKED_VERSIONS.items()}
Format = Literal["rules", "prometheusrule"]
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# labels the rules use themselves: a role label of that name would be ambiguous
_TAKEN = frozenset({"job", "instance", "engine", "le", "slo", "severity", "condition"})


@dataclass(frozen=True)
class AlertOptions:
    """What the rules are written for.

    Args:
        thresholds: the health thresholds (``fleetscope watch``'s, by default).
        versions: engine kind -> version, for the engines the fleet runs (``{"vllm": "0.33.0"}``
            for a vLLM-only fleet); the catalog's families and bucket bounds at those versions.
        scrape_interval: Prometheus' scrape interval for the engines, seconds: the health group
            is evaluated at it, and ``for:`` durations allow for it.
        rate_window: the window of the fleet group's rates and quantiles, seconds.
        metric_prefix: None matches ``vllm:x`` and ``vllm_x`` (Prometheus may store either);
            ``"vllm:"`` or ``"vllm_"`` selects the exact names (SGLang's with the same separator).
        role_label: the target label with ``prefill`` / ``decode`` (SGLang's ``engine_type``
            stands in where a target has none).
        slos: objectives to alert on (:func:`parse_slo`).
    """

    thresholds: HealthThresholds = field(default_factory=HealthThresholds)
    versions: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_VERSIONS))
    scrape_interval: float = 15.0
    rate_window: float = 300.0
    metric_prefix: str | None = None
    role_label: str = "role"
    slos: tuple[Slo, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.versions) - set(ENGINE_KINDS))
        if unknown or not self.versions:
            raise RuleError(f"engines are {' and '.join(ENGINE_KINDS)}, not {unknown or 'none'}")
        if self.metric_prefix not in (None, "vllm:", "vllm_"):
            raise RuleError(f"metric_prefix is 'vllm:' or 'vllm_', not {self.metric_prefix!r}")
        if not _LABEL_RE.fullmatch(self.role_label) or self.role_label.startswith("__"):
            raise RuleError(f"role_label {self.role_label!r} is not a label name")
        if self.role_label in _TAKEN:
            raise RuleError(f"role_label {self.role_label!r} is a label the rules use")
        for name, seconds in (
            ("scrape_interval", self.scrape_interval),
            ("rate_window", self.rate_window),
        ):
            if not seconds >= 0.001:
                raise RuleError(f"{name} must be at least 1 ms, not {seconds!r}")

    @property
    def target(self) -> Target:
        return Target(dict(self.versions), self.metric_prefix, self.role_label)


def rule_groups(options: AlertOptions | None = None) -> list[dict[str, Any]]:
    """The rule groups (``{"name", "interval"?, "rules"}``), as plain data."""
    o = options or AlertOptions()
    target = o.target
    health = HealthRules(target, o.thresholds, o.scrape_interval)
    groups: list[dict[str, Any]] = [
        {
            "name": "fleetscope-health",
            "interval": duration(o.scrape_interval),
            "rules": health.records() + health.alerts(),
        },
        {"name": "fleetscope-fleet", "rules": fleet_rules(target, o.rate_window)},
    ]
    if o.slos:
        try:
            groups.append({"name": "fleetscope-slo", "rules": slo_rules(target, o.slos)})
        except ValueError as e:
            raise RuleError(str(e)) from None
    return groups


def alert_names(options: AlertOptions | None = None) -> list[str]:
    """The alerts the rules define (each once), in order."""
    names = [r["alert"] for g in rule_groups(options) for r in g["rules"] if "alert" in r]
    return list(dict.fromkeys(names))


def rules_yaml(
    options: AlertOptions | None = None,
    format: Format = "rules",
    *,
    name: str = "fleetscope",
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """The rules as a Prometheus rule file (``rules``) or a Kubernetes ``PrometheusRule``
    (``prometheusrule``: the Prometheus Operator's resource, ``spec.groups`` the same groups)."""
    o = options or AlertOptions()
    groups = rule_groups(o)
    head = _header(o)
    if format == "rules":
        return head + dump({"groups": groups})
    if format != "prometheusrule":
        raise ValueError(f"format is rules or prometheusrule, not {format!r}")
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {"groups": groups},
    }
    return head + dump(resource)


def _header(o: AlertOptions) -> str:
    t = o.thresholds
    engines = ", ".join(f"{e} {v}" for e, v in sorted(o.versions.items()))
    lines = [
        "Generated by `fleetscope alerts` (docs/alerts.md): do not edit, generate again.",
        f"Engines: {engines}; scrape interval {duration(o.scrape_interval)}; "
        f"rate window {duration(o.rate_window)}; role label {o.role_label!r}.",
        f"Thresholds: stall {t.stall_seconds:g}s, KV {t.kv_full:g} for {t.kv_seconds:g}s, "
        f"queue {t.queue_seconds:g}s, preemption burst {t.preemption_burst:g}, outlier "
        f"{t.outlier_fraction:g} of the median for {t.outlier_seconds:g}s, "
        f"asleep {t.paused_seconds:g}s.",
    ]
    if o.slos:
        lines.append("SLOs: " + ", ".join(s.name for s in o.slos) + ".")
    return "".join(f"# {line}\n" for line in lines)
