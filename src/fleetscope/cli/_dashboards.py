"""``fleetscope dashboard grafana|wandb`` and ``fleetscope annotate`` (Grafana annotations)."""

from __future__ import annotations

import argparse
import json
import sys
import weakref
from typing import TYPE_CHECKING

from fleetscope.cli._common import write_out

if TYPE_CHECKING:
    from fleetscope.cli._common import Subcommands

# the ``dashboard KIND`` group of each ``dashboard`` parser
_KINDS: weakref.WeakKeyDictionary[argparse.ArgumentParser, Subcommands] = (
    weakref.WeakKeyDictionary()
)


def cmd_dashboard_grafana(args: argparse.Namespace) -> int:
    from fleetscope.dashboards.grafana import dashboard_json

    try:
        text = dashboard_json(
            title=args.title,
            uid=args.uid,
            datasource=args.datasource,
            metric_prefix=args.metric_prefix,
            role_label=args.role_label,
        )
    except ImportError as e:  # the message names the extra: fleetscope[dashboards]
        print(f"fleetscope dashboard grafana: {e}", file=sys.stderr)
        return 1
    return write_out(text, args.out, "dashboard grafana")


def cmd_annotate(args: argparse.Namespace) -> int:
    import logging

    from fleetscope.sinks.grafana import GrafanaAnnotator

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        annotator = GrafanaAnnotator(
            args.url,
            token_env=args.token_env,
            org_id=args.org_id,
            timeout=args.timeout,
            tags=args.tag or ["fleetscope"],
            dashboard_uid=args.dashboard_uid,
        )
    except ValueError as e:
        print(f"fleetscope annotate: {e}", file=sys.stderr)
        return 2
    if args.action == "start":
        ident = annotator.start_run(args.run_id, args.text)
        if ident is not None:
            print(ident)
        ok = ident is not None
    elif args.id is None:
        print("fleetscope annotate finish: --id is required", file=sys.stderr)
        return 2
    else:
        ok = annotator.end_annotation(args.id, status=args.status, run_id=args.run_id)
    annotator.close(finish=False)  # the run region is ended later, by `annotate finish --id`
    return 0 if ok or not args.strict else 1


def dashboard_kinds(sub: Subcommands) -> Subcommands:
    """The ``dashboard KIND`` group, created by whichever dashboard kind is added first."""
    dash = sub.choices.get("dashboard")
    if dash is None:
        dash = sub.add_parser("dashboard", help="generate dashboards from code")

        def dashboard_help(_args: argparse.Namespace) -> int:
            dash.print_help()
            return 2

        dash.set_defaults(func=dashboard_help)
    kinds = _KINDS.get(dash)
    if kinds is None:
        kinds = _KINDS[dash] = dash.add_subparsers(dest="dashboard_kind", metavar="KIND")
    return kinds


def add_grafana_parsers(sub: Subcommands) -> None:
    """``dashboard grafana`` and ``annotate`` (the ``dashboard`` group is shared with other
    dashboard kinds: it is created here only if nobody created it before)."""
    kinds = dashboard_kinds(sub)
    g = kinds.add_parser(
        "grafana",
        help="a Grafana dashboard (JSON) for vLLM series scraped by Prometheus",
        description=(
            "Write a Grafana dashboard built with grafana-foundation-sdk: prime-rl's 7 fleet "
            "panels (aggregate + the engine tail), latency quantiles, truncation share and "
            "scrape health, split by the target label --role-label."
        ),
    )
    g.add_argument("--out", default=None, help="output file (default: stdout)")
    g.add_argument(
        "--datasource",
        default=None,
        help="Prometheus data source uid (default: a $datasource variable)",
    )
    g.add_argument("--title", default="vLLM fleet (fleetscope)")
    g.add_argument("--uid", default="fleetscope-vllm-fleet", help="dashboard uid")
    g.add_argument(
        "--metric-prefix",
        default=None,
        help="exact name prefix, 'vllm:' or 'vllm_' (default: match both, as Prometheus may "
        "store vllm:x as vllm_x)",
    )
    g.add_argument("--role-label", default="role", help="target label with prefill/decode")
    g.set_defaults(func=cmd_dashboard_grafana)

    a = sub.add_parser(
        "annotate",
        help="Grafana annotation for a run: start (prints its id) / finish",
        description=(
            "start: POST a run annotation and print its id. finish --id ID: set its end time "
            "and status tag. The token is read from $GRAFANA_TOKEN (--token-env). Failures are "
            "warnings and exit 0 unless --strict."
        ),
    )
    a.add_argument("action", choices=["start", "finish"])
    a.add_argument("url", help="Grafana base URL, http(s)://host[:port]")
    a.add_argument("--run-id", default=None, help="run id (tag run-id:ID)")
    a.add_argument("--text", default=None, help="annotation text (start)")
    a.add_argument("--id", type=int, default=None, help="annotation id to finish")
    a.add_argument("--status", default="success", help="status tag for finish (success)")
    a.add_argument("--tag", action="append", help="tag on the annotation (repeat; fleetscope)")
    a.add_argument("--token-env", default="GRAFANA_TOKEN", help="env var with the bearer token")
    a.add_argument("--org-id", type=int, default=None)
    a.add_argument("--dashboard-uid", default=None, help="attach to this dashboard only")
    a.add_argument("--timeout", type=float, default=5.0, help="per-request timeout (5)")
    a.add_argument("--strict", action="store_true", help="exit 1 if Grafana did not accept it")
    a.set_defaults(func=cmd_annotate)


def cmd_dashboard_wandb(args: argparse.Namespace) -> int:
    from fleetscope.dashboards import wandb_workspace as ww

    if args.window is None:
        args.window = ["train", "eval"]

    if args.dry_run:  # the panels only, no W&B call
        disagg = args.mode == "role-aware"
        panels = ww.inference_panels(disagg, args.prefix)
        breakdown = ww.breakdown_panels(args.window, disagg, args.prefix)
        out = {
            "name": args.name or ww.default_view_name(disagg),
            "section": ww.SECTION_NAME,
            "disaggregated": disagg,
            "panels": [{"title": p.title, "keys": list(p.keys)} for p in panels],
            "breakdown_section": ww.BREAKDOWN_SECTION_NAME,
            "breakdown_panels": [{"title": p.title, "keys": list(p.keys)} for p in breakdown],
        }
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    try:
        if args.mode == "auto":
            disagg = ww.detect_disaggregated(args.entity, args.project, prefix=args.prefix)
        else:
            disagg = args.mode == "role-aware"
        result = ww.publish_workspace(
            args.entity,
            args.project,
            disaggregated=disagg,
            name=args.name,
            prefix=args.prefix,
            x_axis=args.x_axis,
            windows=args.window,
        )
    except Exception as e:
        print(f"fleetscope dashboard wandb: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    kind = "role-aware (prefill/decode)" if disagg else "colocated"
    print(f"{result.action}: {kind} view {result.workspace.name!r} {result.url or ''}".rstrip())
    return 0


def add_wandb_dashboard_parser(sub: Subcommands) -> None:
    """``dashboard wandb`` (the ``dashboard`` group is shared: created here if missing)."""
    kinds = dashboard_kinds(sub)
    w = kinds.add_parser(
        "wandb",
        help="a W&B workspace view with the inference section (wandb-workspaces)",
        description=(
            "Save a W&B view whose Inference section pairs each fleet aggregate with the "
            "engine tail (prime-rl's 7 panels, TTFT/TPOT/ITL, truncation, collector health). "
            "An identical view of the same name is reused, a differing one updated in place."
        ),
    )
    w.add_argument("--entity", required=True, help="W&B entity (user or team)")
    w.add_argument("--project", required=True, help="W&B project")
    mode = w.add_mutually_exclusive_group()
    mode.add_argument(
        "--role-aware",
        dest="mode",
        action="store_const",
        const="role-aware",
        help="disaggregated runs: tails from the prefill/decode scopes",
    )
    mode.add_argument(
        "--plain",
        dest="mode",
        action="store_const",
        const="plain",
        help="colocated runs: everything from the agg scope",
    )
    mode.add_argument(
        "--auto",
        dest="mode",
        action="store_const",
        const="auto",
        help="role-aware if a recent run of the project logged prefill/decode keys (default)",
    )
    w.set_defaults(mode="auto")
    w.add_argument("--name", default=None, help="view name (default: fleetscope: inference...)")
    w.add_argument("--prefix", default="inference", help="key prefix the runs log (inference)")
    w.add_argument("--x-axis", default="WallTime", help="x axis of every panel (WallTime)")
    w.add_argument(
        "--window",
        action="append",
        default=None,
        metavar="LABEL",
        help="a window label the runs use: an Engine time panel for it (idle / busy / "
        "saturated / paused / syncing shares at each stop); repeat (default: train, eval)",
    )
    w.add_argument(
        "--dry-run",
        action="store_true",
        help="print the panels as JSON, contact nothing (--auto counts as --plain)",
    )
    w.set_defaults(func=cmd_dashboard_wandb)
