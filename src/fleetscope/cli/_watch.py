"""``fleetscope watch``: poll a fleet and log its statistics; the endpoints file it follows."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
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
    url_problem,
)

if TYPE_CHECKING:
    from fleetscope.cli._common import Subcommands
    from fleetscope.collector.core import Collector
    from fleetscope.health import HealthThresholds
    from fleetscope.sources.http.source import Endpoint

#: how the endpoints-file helpers wait (``asyncio.sleep`` unless a test passes its own)
Pause = Callable[[float], Awaitable[object]]


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


ENDPOINTS_FILE_SETTLE_S = 0.2


def read_endpoints_file(path: str) -> list[Endpoint]:
    """An endpoints file: one endpoint per line, ``URL`` or ``prefill=URL`` / ``decode=URL``;
    blank lines and ``#`` comments are ignored."""
    with open(path, encoding="utf-8") as f:
        return parse_endpoints_text(f.read())


def parse_endpoints_text(text: str) -> list[Endpoint]:
    """The endpoints listed in an endpoints file's text (see :func:`read_endpoints_file`);
    ``ValueError`` naming the line for anything that is not a URL."""
    from fleetscope.sources.http.source import Endpoint

    eps: list[Endpoint] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            role, url = role_and_url(line)
        except ValueError as e:
            raise ValueError(f"line {lineno}: {e}") from None
        problem = url_problem(url)
        if problem is not None:
            raise ValueError(f"line {lineno}: {problem}")
        eps.append(Endpoint(url=url, role=role))
    return eps


async def read_stable_text(
    path: str, settle: float = ENDPOINTS_FILE_SETTLE_S, pause: Pause | None = None
) -> str:
    """The file's text once two reads ``settle`` seconds apart agree (an editor or a script
    rewriting it leaves it empty or cut short for a moment); ``OSError`` if unreadable,
    ``ValueError`` if it keeps changing (five tries)."""
    import asyncio

    pause = pause or asyncio.sleep
    for _ in range(5):
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.read()
        await pause(settle)
        with open(path, encoding="utf-8", errors="replace") as f:
            second = f.read()
        if first == second:
            return second
    raise ValueError("still being written (it changed between reads); will read it again")


async def follow_endpoints_file(
    collector: Collector,
    path: str,
    fixed: Sequence[Endpoint],
    interval: float,
    *,
    settle: float = ENDPOINTS_FILE_SETTLE_S,
    pause: Pause | None = None,
    applied: str | None = None,
) -> None:
    """Re-read ``path`` when it changes and make the watched fleet ``fixed`` + its endpoints.

    A change is applied only when the file parses AND reads the same twice ``settle`` seconds
    apart (``read_stable_text``): a file that is empty or cut mid-line for a moment, while it
    is rewritten, is not applied. An empty file (no servers) is applied like any other once it
    stays empty across the two reads. Endpoints whose URL stays keep their names
    (``Collector.set_endpoints`` matches by URL). A file that cannot be read or parsed keeps the
    fleet as it is, with one warning per distinct problem. ``applied``: the text the fleet was
    built from already (at start), so it is not applied again."""
    import asyncio
    import logging
    import os

    from fleetscope.util.redact import redact

    log = logging.getLogger("fleetscope")
    seen: tuple[int, int, int] | None = None
    last_error: str | None = None
    while True:
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != seen:
                text = await read_stable_text(path, settle, pause)
                endpoints = parse_endpoints_text(text)
                seen, last_error = stamp, None
                if text != applied:
                    applied = text
                    added, removed = collector.set_endpoints([*fixed, *endpoints])
                    if added or removed:
                        changes = [f"+{e.name}={e.url}" for e in added]
                        changes += [f"-{n}" for n in removed]
                        log.warning(
                            "fleetscope: %s: fleet changed: %s", path, redact(", ".join(changes))
                        )
        except (OSError, ValueError) as e:
            seen = None  # read it again next time
            if str(e) != last_error:  # once per distinct problem, not every interval
                last_error = str(e)
                log.warning(
                    "fleetscope: endpoints file %s: %s; fleet unchanged", path, redact(str(e))
                )
        await (pause or asyncio.sleep)(interval)


def _health_thresholds(args: argparse.Namespace) -> HealthThresholds:
    """The health thresholds the ``watch`` flags set (the others keep their defaults)."""
    from fleetscope.health import HealthThresholds

    return HealthThresholds(
        stall_seconds=args.stall_seconds,
        outlier_seconds=args.outlier_seconds,
        stale_seconds=args.stale_seconds,
        paused_seconds=args.paused_seconds,
    )


def _collector(args: argparse.Namespace, endpoints: Sequence[Endpoint], sinks: Any) -> Collector:
    """The collector the ``watch`` flags describe: the endpoints over HTTP, or the engines of a
    multiprocess directory (``--multiproc-dir``); the policy version file followed."""
    from fleetscope.collector.core import Collector

    options: dict[str, Any] = dict(sinks=sinks, health_thresholds=_health_thresholds(args))
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
    from fleetscope.health import HealthThresholds

    health_defaults = HealthThresholds()
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
        help="more endpoints, one per line (URL, prefill=URL, decode=URL); re-read when it "
        "changes, so servers can be added and removed while watching. A change is applied only "
        "once the file parses and reads the same twice 0.2 s apart (an empty file too: no "
        "servers); servers whose URL stays keep their names. Write it atomically (a temporary "
        "file, then rename) to be safe from any reader",
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
    w.add_argument(
        "--stall-seconds",
        type=float,
        default=health_defaults.stall_seconds,
        help="health: requests running and no token for this long is a stall (%(default)s)",
    )
    w.add_argument(
        "--outlier-seconds",
        type=float,
        default=health_defaults.outlier_seconds,
        help="health: this long far below its role's median token rate (%(default)s)",
    )
    w.add_argument(
        "--stale-seconds",
        type=float,
        default=health_defaults.stale_seconds,
        help="health: a server still on an older policy version this long after the trainer "
        "announced a newer one is stale_version (%(default)s)",
    )
    w.add_argument(
        "--paused-seconds",
        type=float,
        default=health_defaults.paused_seconds,
        help="health: an engine paused or asleep this long while no weight sync is open is "
        "engine_paused (%(default)s)",
    )
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
