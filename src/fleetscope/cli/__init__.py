"""The ``fleetscope`` command line.

One module per command group: ``_inspect`` (inspect), ``_watch`` (watch; ``_endpoints_file``:
the endpoints file it follows), ``_demo`` (simulate, demo), ``_dashboards`` (dashboard
grafana|wandb, annotate), ``_alerts`` (alerts: Prometheus rules); ``_common`` holds the options
they share. Every name is re-exported here.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from fleetscope import __version__
from fleetscope.cli._alerts import add_alerts_parser, cmd_alerts
from fleetscope.cli._common import add_sink_args, build_sinks, headers_from_args, role_and_url
from fleetscope.cli._dashboards import (
    add_grafana_parsers,
    add_wandb_dashboard_parser,
    cmd_annotate,
    cmd_dashboard_grafana,
    cmd_dashboard_wandb,
    dashboard_kinds,
)
from fleetscope.cli._demo import add_demo_parsers, cmd_demo, cmd_simulate
from fleetscope.cli._endpoints_file import (
    ENDPOINTS_FILE_EVIDENCE_READS,
    ENDPOINTS_FILE_EVIDENCE_S,
    ENDPOINTS_FILE_READ_S,
    ENDPOINTS_FILE_SETTLE_S,
    EndpointsFileRule,
    FileRead,
    follow_endpoints_file,
    parse_endpoints_text,
    read_endpoints_file,
    read_file,
    read_stable_text,
)
from fleetscope.cli._inspect import (
    SourceError,
    add_inspect_parser,
    cmd_inspect,
    print_table,
    read_source,
)
from fleetscope.cli._watch import (
    add_watch_parser,
    cmd_watch,
    endpoints_from_args,
    watch_once,
)

__all__ = [
    "ENDPOINTS_FILE_EVIDENCE_READS",
    "ENDPOINTS_FILE_EVIDENCE_S",
    "ENDPOINTS_FILE_READ_S",
    "ENDPOINTS_FILE_SETTLE_S",
    "EndpointsFileRule",
    "FileRead",
    "SourceError",
    "add_alerts_parser",
    "add_grafana_parsers",
    "add_sink_args",
    "add_wandb_dashboard_parser",
    "build_parser",
    "build_sinks",
    "cmd_alerts",
    "cmd_annotate",
    "cmd_dashboard_grafana",
    "cmd_dashboard_wandb",
    "cmd_demo",
    "cmd_inspect",
    "cmd_simulate",
    "cmd_watch",
    "dashboard_kinds",
    "endpoints_from_args",
    "follow_endpoints_file",
    "headers_from_args",
    "main",
    "parse_endpoints_text",
    "print_table",
    "read_endpoints_file",
    "read_file",
    "read_source",
    "read_stable_text",
    "role_and_url",
    "watch_once",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetscope",
        description="Correct fleet statistics for vLLM inference engines from their /metrics.",
    )
    p.add_argument("--version", action="version", version=f"fleetscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    add_inspect_parser(sub)
    add_watch_parser(sub)
    add_demo_parsers(sub)
    add_grafana_parsers(sub)
    add_wandb_dashboard_parser(sub)
    add_alerts_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fleetscope`` command: its exit code (2: a usage error, 1: a runtime failure).

    Output into a pipe that closed (``fleetscope inspect ... --json | head``) ends the command
    quietly, as a standard tool ends on SIGPIPE: no traceback, nothing on stderr, exit code 1
    (as rich's console does for the tables)."""
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        _drop_stdout()
        return 1


def _run(argv: list[str]) -> int:
    if argv[:1] == ["simulate"]:
        # argparse.REMAINDER does not take options that come first (`simulate --endpoints 4`
        # was "unrecognized arguments"): the simulator parses its own command line
        from fleetscope_sim.server import cli_main

        return int(cli_main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    usage_check = getattr(args, "usage_check", None)
    if usage_check is not None:
        usage_check(args)  # a usage error exits here, with code 2
    return int(args.func(args) or 0)


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for the closed pipe is dropped when
    Python exits, not reported as a second BrokenPipeError."""
    import os

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
