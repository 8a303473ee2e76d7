"""``fleetscope watch``: poll a fleet and log its statistics (the endpoints file it follows:
``_endpoints_file``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fleetscope.cli._common import (
    add_sink_args,
    add_usage_check,
    build_sinks,
    endpoint_url,
    headers_from_args,
    positive_float,
    role_and_url,
    role_spec,
)
from fleetscope.cli._endpoints_file import (
    follow_endpoints_file,
    parse_endpoints_text,
    read_stable_text,
)
from fleetscope.cli._health_flags import add_health_flags, health_thresholds

if TYPE_CHECKING:
    from fleetscope.cli._common import Subcommands
    from fleetscope.collector.core import Collector
    from fleetscope.sources.http.source import Endpoint


def endpoints_from_args(args: argparse.Namespace) -> list[Endpoint]:
    from fleetscope.sources.http.source import Endpoint

    eps = [Endpoint(url=u) for u in args.urls]
    for spec in args.role or []:
        try:
            role, url = role_and_url(spec)
        except ValueError:
            role = None
        if role is None:
            from fleetscope.util.redact import redact

            raise SystemExit(
                redact(f"fleetscope: --role takes prefill=URL or decode=URL, not {spec!r}")
            )
        eps.append(Endpoint(url=url, role=role))
    elsewhere = ("endpoints_file", "multiproc_dir")  # endpoints that come from elsewhere
    if not eps and not any(getattr(args, a, None) for a in elsewhere):
        raise SystemExit("fleetscope: give at least one endpoint URL (or --endpoints-file)")
    return eps


def _collector(args: argparse.Namespace, endpoints: Sequence[Endpoint], sinks: Any) -> Collector:
    """The collector the ``watch`` flags describe: the endpoints over HTTP, or the engines of a
    multiprocess directory (``--multiproc-dir``); the policy version file followed."""
    from fleetscope.collector.core import Collector

    options: dict[str, Any] = dict(sinks=sinks, health_thresholds=health_thresholds(args))
    options.update(interval=args.interval, timeout=args.timeout, schema=args.schema)
    if args.multiproc_dir:
        from fleetscope.sources.multiproc import MultiprocessSource

        collector = Collector(source=MultiprocessSource(args.multiproc_dir), **options)
    else:
        options.update(headers=headers_from_args(args), verify=not args.insecure)
        collector = Collector(endpoints, **options)
    if args.policy_version_file:
        from fleetscope.cli._policy_file import PolicyVersionFile

        follower = PolicyVersionFile(args.policy_version_file, collector)
        follower.check()  # before the first poll
        collector.on_poll = follower.on_poll  # then after each poll, for the next one
    return collector


def cmd_watch(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from fleetscope.collector.signals import stop_on_signals

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    fixed = endpoints_from_args(args)
    endpoints = list(fixed)
    initial_text = None
    if args.endpoints_file:
        try:
            initial_text = asyncio.run(read_stable_text(args.endpoints_file))
            endpoints += parse_endpoints_text(initial_text)
        except (OSError, ValueError) as e:
            from fleetscope.util.redact import redact

            raise SystemExit(
                f"fleetscope: endpoints file {args.endpoints_file}: {redact(str(e))}"
            ) from None
    if args.once:
        return asyncio.run(watch_once(args, endpoints))
    collector = _collector(args, endpoints, build_sinks(args, terminal=not args.no_tui))

    async def run() -> None:
        async with collector:
            follow = None
            if args.endpoints_file:
                follow = asyncio.create_task(
                    follow_endpoints_file(
                        collector,
                        args.endpoints_file,
                        fixed,
                        args.interval,
                        applied=initial_text,
                    )
                )
            # SIGINT, SIGTERM and SIGHUP: last poll, run summary to every sink, sinks closed,
            # exit 0 (fleetscope.collector.signals; a second signal during the stop is ignored)
            stopper = stop_on_signals(collector, chain=False)
            try:
                waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stopper.wait())]
                if args.duration:
                    waits.append(asyncio.ensure_future(asyncio.sleep(args.duration)))
                _done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for t in pending:
                    t.cancel()
            finally:
                if follow is not None:
                    follow.cancel()
                if stopper.received is None:
                    stopper.ignore_further()  # --duration: one stop, not two at once
                    await collector.stop()
                else:
                    await asyncio.shield(asyncio.ensure_future(stopper.wait()))
                stopper.restore()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


async def watch_once(args: argparse.Namespace, endpoints: Sequence[Endpoint]) -> int:
    """Two polls one interval apart, printed; ``--jsonl`` and W&B get them too, then the run
    summary (as from ``watch``)."""
    import asyncio

    collector = _collector(args, endpoints, build_sinks(args, terminal=False))
    await collector.poll()
    await asyncio.sleep(args.interval)
    view = await collector.poll()
    await collector.stop()
    keys = dict(sorted(view.keys.items()))
    if args.json:
        json.dump(keys, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from fleetscope.sinks.terminal import TerminalSink

        TerminalSink(live=False).log_poll(view.result)
    return 0 if view.endpoints_reporting == view.endpoints_expected else 1


def add_watch_parser(sub: Subcommands) -> None:
    """``watch``."""
    w = sub.add_parser(
        "watch",
        help="watch a fleet: live view, W&B, JSONL",
        usage="%(prog)s [options] [URL ...]",
        description="Poll every endpoint's /metrics and log correct fleet statistics.",
    )
    w.add_argument(
        "urls", nargs="*", type=endpoint_url, help="base URLs of vLLM servers (role: none)"
    )
    w.add_argument(
        "--role",
        action="append",
        type=role_spec,
        metavar="ROLE=URL",
        help="prefill=URL or decode=URL (repeat)",
    )
    w.add_argument(
        "--endpoints-file",
        default=None,
        metavar="FILE",
        help="more endpoints, one per line (URL, prefill=URL, decode=URL); read every second, "
        "so servers can be added and removed while watching. A change is applied once the file "
        "parses and reads the same twice in a row (a renamed file: at once); a file that lists "
        "no server, or whose last line has no newline, only once it stays so for 5 s (or two "
        "intervals). A server keeps its name while it is listed and gets it back if it returns. "
        "Write it atomically (a temporary file, then rename) to be safe from any reader",
    )
    w.add_argument(
        "--multiproc-dir",
        default=None,
        metavar="DIR",
        help="no endpoints: read this machine's engines from prometheus_client's multiprocess "
        "files (PROMETHEUS_MULTIPROC_DIR of vLLM's API servers, SGLang's schedulers)",
    )
    w.add_argument(
        "--policy-version-file",
        default=None,
        metavar="FILE",
        help="the trainer's current policy version (first line); checked every poll (re-read "
        "when its mtime changes) and compared with each server's /weight_info "
        "(docs/rl-lifecycle.md). Write it atomically",
    )
    w.add_argument("--interval", type=positive_float, default=5.0, help="seconds between polls (5)")
    w.add_argument("--timeout", type=positive_float, default=5.0, help="per-scrape timeout (5)")
    add_health_flags(w, stale=True)
    w.add_argument(
        "--duration", type=positive_float, default=None, help="stop after this many seconds"
    )
    w.add_argument(
        "--once",
        action="store_true",
        help="two polls one interval apart, print (and log them to --jsonl / W&B), exit",
    )
    w.add_argument("--json", action="store_true", help="with --once: keys as one JSON object")
    w.add_argument(
        "--no-tui", action="store_true", help="no live terminal view (give --jsonl or W&B)"
    )
    w.add_argument("--schema", choices=["prime-rl", "skyrl"], default="prime-rl")
    w.add_argument("--bearer-token", default=None, help="Authorization: Bearer token")
    w.add_argument("--bearer-env", default=None, help="read the bearer token from this env var")
    w.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    add_sink_args(w)
    w.set_defaults(func=cmd_watch)
    add_usage_check(w, _watch_usage_problem)


#: the W&B options that only mean something with --wandb-project: (flag, dest)
WANDB_OPTIONS = (
    ("--wandb-entity", "wandb_entity"),
    ("--wandb-name", "wandb_name"),
    ("--wandb-dir", "wandb_dir"),
    ("--wandb-alerts", "wandb_alerts"),
    ("--wandb-keys", "wandb_keys"),
    ("--wandb-mode", "wandb_mode"),
)


def _watch_usage_problem(args: argparse.Namespace) -> str | None:
    """Options of ``watch`` that would silently do nothing together (a usage error)."""
    if args.multiproc_dir and (args.urls or args.role or args.endpoints_file):
        return "--multiproc-dir reads this machine's engines from their files: give no endpoints"
    if not (args.urls or args.role or args.endpoints_file or args.multiproc_dir):
        return "give at least one endpoint URL (or --role, --endpoints-file, --multiproc-dir)"
    if not args.wandb_project:
        given = [flag for flag, dest in WANDB_OPTIONS if getattr(args, dest) not in (None, False)]
        if given:
            return f"{given[0]} needs --wandb-project PROJECT (the W&B project to log to)"
    if args.once:
        if args.duration is not None:
            return "--duration does nothing with --once (two polls one --interval apart)"
        return None
    if args.json:
        return "--json needs --once (to log every poll as JSON, use --jsonl FILE)"
    if args.no_tui and not (args.jsonl or args.wandb_project):
        return "--no-tui needs --jsonl FILE or --wandb-project PROJECT (else nothing is output)"
    return None
