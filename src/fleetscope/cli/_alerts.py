"""``fleetscope alerts``: Prometheus alerting and recording rules for a fleet (docs/alerts.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fleetscope.cli._common import add_usage_check, positive_float, write_out
from fleetscope.cli._health_flags import add_health_flags, health_thresholds

if TYPE_CHECKING:
    from fleetscope.cli._common import Subcommands
    from fleetscope.dashboards.alerts import AlertOptions, Slo

ENGINES = {"vllm": ("vllm",), "sglang": ("sglang",), "both": ("vllm", "sglang")}


def slo_spec(text: str) -> Slo:
    """argparse ``type=`` for ``--slo``: ``ttft:0.99<2.5s``."""
    from fleetscope.dashboards.alerts import parse_slo

    try:
        return parse_slo(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def key_value(text: str) -> tuple[str, str]:
    """argparse ``type=`` for ``KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


def alert_options(args: argparse.Namespace) -> AlertOptions:
    """The options the flags say (``RuleError`` for ones the rules cannot honour)."""
    from fleetscope.dashboards.alerts import DEFAULT_VERSIONS, AlertOptions, RuleError

    engines = ENGINES[args.engines]
    versions = {e: DEFAULT_VERSIONS[e] for e in engines}
    for engine, version in args.engine_version or []:
        if engine not in engines:
            raise RuleError(f"--engine-version {engine}={version}: --engines is {args.engines}")
        versions[engine] = version
    return AlertOptions(
        thresholds=health_thresholds(args),
        versions=versions,
        scrape_interval=args.scrape_interval,
        rate_window=args.rate_window,
        metric_prefix=args.metric_prefix,
        role_label=args.role_label,
        slos=tuple(args.slo or ()),
    )


def _rules_text(args: argparse.Namespace) -> str:
    from fleetscope.dashboards.alerts import rules_yaml

    return rules_yaml(
        alert_options(args),
        args.format,
        name=args.name,
        namespace=args.namespace,
        labels=dict(args.crd_label or []),
    )


def _usage_problem(args: argparse.Namespace) -> str | None:
    """Options the rules cannot honour (an SLO threshold that is no bucket bound, a version
    whose families or buckets the catalog lacks...): a usage error, in one line."""
    from fleetscope.dashboards.alerts import RuleError

    try:
        _rules_text(args)
    except RuleError as e:
        return str(e)
    return None


def cmd_alerts(args: argparse.Namespace) -> int:
    return write_out(_rules_text(args), args.out, "alerts")


def add_alerts_parser(sub: Subcommands) -> None:
    """``alerts``."""
    a = sub.add_parser(
        "alerts",
        usage="%(prog)s [options]",
        help="Prometheus alerting and recording rules for the fleet's health and SLOs",
        description=(
            "Write Prometheus rules: an alert for each fleetscope health condition, per engine, "
            "for vLLM and SGLang series (the thresholds of `watch`), recording rules for the "
            "fleet's latency quantiles, prefix hit rate and token rates per role, and "
            "multiwindow burn-rate alerts for --slo objectives (docs/alerts.md)."
        ),
    )
    a.add_argument("--out", default=None, help="output file (default: stdout)")
    a.add_argument(
        "--format",
        choices=["rules", "prometheusrule"],
        default="rules",
        help="a Prometheus rule file (default) or a Kubernetes PrometheusRule resource",
    )
    a.add_argument(
        "--engines", choices=list(ENGINES), default="both", help="engines the fleet runs (both)"
    )
    a.add_argument(
        "--engine-version",
        action="append",
        type=key_value,
        metavar="ENGINE=VERSION",
        help="an engine's version (default: the newest the catalog knows, vllm 0.33.0, "
        "sglang 0.5.23); repeat per engine",
    )
    a.add_argument(
        "--scrape-interval",
        type=positive_float,
        default=15.0,
        help="seconds between Prometheus' scrapes of the engines: the health rules are "
        "evaluated at it (%(default)s)",
    )
    a.add_argument(
        "--rate-window",
        type=positive_float,
        default=300.0,
        help="seconds of the recorded rates and quantiles (%(default)s)",
    )
    a.add_argument(
        "--metric-prefix",
        choices=["vllm:", "vllm_"],
        default=None,
        help="exact names, 'vllm:' or 'vllm_' (default: match both, as Prometheus may store "
        "vllm:x as vllm_x); SGLang's take the same separator",
    )
    a.add_argument("--role-label", default="role", help="target label with prefill/decode")
    a.add_argument(
        "--slo",
        action="append",
        type=slo_spec,
        metavar="SLI:OBJECTIVE<THRESHOLD",
        help="an objective such as ttft:0.99<2.5s (SLI: ttft, itl, tpot, e2e; the threshold "
        "must be a bucket bound of every engine); repeat",
    )
    add_health_flags(a, stale=False)
    a.add_argument("--name", default="fleetscope", help="prometheusrule: metadata.name")
    a.add_argument("--namespace", default=None, help="prometheusrule: metadata.namespace")
    a.add_argument(
        "--crd-label",
        action="append",
        type=key_value,
        metavar="KEY=VALUE",
        help="prometheusrule: a metadata label (the operator's ruleSelector); repeat",
    )
    add_usage_check(a, _usage_problem)
    a.set_defaults(func=cmd_alerts)
