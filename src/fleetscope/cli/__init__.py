"""The ``fleetscope`` command line.

One module per command group: ``_inspect`` (inspect), ``_watch`` (watch and the endpoints file
it follows), ``_demo`` (simulate, demo), ``_dashboards`` (dashboard grafana|wandb, annotate);
``_common`` holds the options they share. Every name is re-exported here.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from fleetscope import __version__
from fleetscope.cli._common import _add_sink_args, _headers_from_args, _role_and_url, build_sinks
from fleetscope.cli._dashboards import (
    _add_grafana_parsers,
    _add_wandb_dashboard_parser,
    _dashboard_kinds,
    cmd_annotate,
    cmd_dashboard_grafana,
    cmd_dashboard_wandb,
)
from fleetscope.cli._demo import add_demo_parsers, cmd_demo, cmd_simulate
from fleetscope.cli._inspect import (
    SourceError,
    _print_table,
    _read_source,
    add_inspect_parser,
    cmd_inspect,
)
from fleetscope.cli._watch import (
    ENDPOINTS_FILE_SETTLE_S,
    _endpoints_from_args,
    _follow_endpoints_file,
    _watch_once,
    add_watch_parser,
    cmd_watch,
    parse_endpoints_text,
    read_endpoints_file,
    read_stable_text,
)

__all__ = [
    "ENDPOINTS_FILE_SETTLE_S",
    "SourceError",
    "_add_grafana_parsers",
    "_add_sink_args",
    "_add_wandb_dashboard_parser",
    "_dashboard_kinds",
    "_endpoints_from_args",
    "_follow_endpoints_file",
    "_headers_from_args",
    "_print_table",
    "_read_source",
    "_role_and_url",
    "_watch_once",
    "build_parser",
    "build_sinks",
    "cmd_annotate",
    "cmd_dashboard_grafana",
    "cmd_dashboard_wandb",
    "cmd_demo",
    "cmd_inspect",
    "cmd_simulate",
    "cmd_watch",
    "main",
    "parse_endpoints_text",
    "read_endpoints_file",
    "read_stable_text",
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
    _add_grafana_parsers(sub)
    _add_wandb_dashboard_parser(sub)
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
