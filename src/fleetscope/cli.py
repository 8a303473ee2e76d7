"""The ``fleetscope`` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fleetscope import __version__


class SourceError(Exception):
    """A body that could not be read within the bounds (size, time)."""


def _read_source(
    source: str, timeout: float, *, max_bytes: int | None = None
) -> tuple[bytes, float, float]:
    """A body from a file or a URL, with the (monotonic, wall) time it arrived.

    Bounded like the collector's scrapes: at most ``max_bytes`` (default
    ``fleetscope.exposition.MAX_BODY_BYTES``), and a URL's whole download (connect, headers,
    body) within ``timeout`` seconds, not just per read."""
    from fleetscope.exposition import MAX_BODY_BYTES

    cap = MAX_BODY_BYTES if max_bytes is None else max_bytes
    if source.startswith(("http://", "https://")):
        import httpx

        from fleetscope._redact import redact

        url = source if source.rstrip("/").endswith("/metrics") else source.rstrip("/") + "/metrics"
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        size = 0
        with httpx.Client(timeout=timeout) as client, client.stream("GET", url) as r:
            r.raise_for_status()
            declared = r.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > cap:
                raise SourceError(f"body of {int(declared)} bytes exceeds the {cap} byte cap")
            for chunk in r.iter_bytes():
                size += len(chunk)
                if size > cap:
                    raise SourceError(f"body exceeds the {cap} byte cap")
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"{redact(url)}: body not complete after {timeout:g} s (--timeout)"
                    )
        return b"".join(chunks), time.monotonic(), time.time()
    path = Path(source)
    with path.open("rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise SourceError(f"file larger than the {cap} byte cap")
    return data, time.monotonic(), time.time()


def cmd_inspect(args: argparse.Namespace) -> int:
    from fleetscope.exposition import Parser
    from fleetscope.fleet import FleetState, ScrapeResult
    from fleetscope.keys import KeyOptions

    parser = Parser()
    state = FleetState(key_options=KeyOptions(schema=args.schema))
    role = args.role
    name = args.name or (f"{role}0" if role else "server0")
    is_url = args.prev.startswith(("http://", "https://"))
    results = []
    for i, src in enumerate((args.prev, args.cur)):
        if i == 1 and is_url and args.prev == args.cur:
            time.sleep(args.interval)
        try:
            body, mono, wall = _read_source(src, args.timeout)
            if not is_url:  # saved files: the interval is what the user says it was
                mono = i * args.interval
            expo = parser.parse(body, time=mono, wall_time=wall)
        except Exception as e:
            from fleetscope._redact import redact

            print(
                f"fleetscope inspect: cannot read {redact(src)}: {redact(str(e))}", file=sys.stderr
            )
            return 2
        results.append(ScrapeResult(name, expo, mono, wall, role=role))
    state.observe([results[0]])
    poll = state.observe([results[1]])
    keys = dict(sorted(poll.keys.items()))
    if args.json:
        json.dump(keys, sys.stdout, indent=None if args.compact else 1)
        sys.stdout.write("\n")
        return 0
    _print_table(keys, args)
    return 0


def _endpoints_from_args(args: argparse.Namespace):
    from fleetscope.sources.http import Endpoint

    eps = [Endpoint(url=u) for u in args.urls]
    for spec in args.role or []:
        try:
            role, url = _role_and_url(spec)
        except ValueError:
            role = None
        if role is None:
            from fleetscope._redact import redact

            raise SystemExit(
                redact(f"fleetscope: --role takes prefill=URL or decode=URL, not {spec!r}")
            )
        eps.append(Endpoint(url=url, role=role))
    if not eps and not getattr(args, "endpoints_file", None):
        raise SystemExit("fleetscope: give at least one endpoint URL (or --endpoints-file)")
    return eps


def _role_and_url(spec: str) -> tuple[str | None, str]:
    """``URL`` (no role), or ``prefill=URL`` / ``decode=URL``."""
    role, sep, url = spec.partition("=")
    if not sep or "://" in role:
        return None, spec.strip()
    if role not in ("prefill", "decode") or not url.strip():
        raise ValueError("expected URL, prefill=URL or decode=URL")
    return role, url.strip()


ENDPOINTS_FILE_SETTLE_S = 0.2


def read_endpoints_file(path: str):
    """An endpoints file: one endpoint per line, ``URL`` or ``prefill=URL`` / ``decode=URL``;
    blank lines and ``#`` comments are ignored."""
    with open(path, encoding="utf-8") as f:
        return parse_endpoints_text(f.read())


def parse_endpoints_text(text: str):
    """The endpoints listed in an endpoints file's text (see :func:`read_endpoints_file`);
    ``ValueError`` naming the line for anything that is not a URL."""
    import httpx

    from fleetscope.sources.http import Endpoint

    eps = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            role, url = _role_and_url(line)
        except ValueError as e:
            raise ValueError(f"line {lineno}: {e}") from None
        try:
            parsed = httpx.URL(url)
            port = parsed.port
        except (httpx.InvalidURL, ValueError) as e:
            raise ValueError(f"line {lineno}: {url!r} is not a URL ({e})") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"line {lineno}: {url!r} is not an http(s) URL")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"line {lineno}: {url!r} has no valid port")
        eps.append(Endpoint(url=url, role=role))
    return eps


async def read_stable_text(path: str, settle: float = ENDPOINTS_FILE_SETTLE_S, pause=None) -> str:
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


async def _follow_endpoints_file(
    collector,
    path: str,
    fixed,
    interval: float,
    *,
    settle: float = ENDPOINTS_FILE_SETTLE_S,
    pause=None,
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

    from fleetscope._redact import redact

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


def _headers_from_args(args: argparse.Namespace) -> dict[str, str]:
    import os

    headers = {}
    token = args.bearer_token or (os.environ.get(args.bearer_env) if args.bearer_env else None)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def build_sinks(args: argparse.Namespace, *, terminal: bool) -> list:
    sinks: list = []
    if terminal:
        from fleetscope.sinks.terminal import TerminalSink

        sinks.append(TerminalSink())
    if args.jsonl:
        from fleetscope.sinks.jsonl import JsonlSink

        sinks.append(JsonlSink(args.jsonl))
    if args.wandb_project:
        from fleetscope.sinks.wandb import WandbSink

        sinks.append(
            WandbSink(
                project=args.wandb_project,
                entity=args.wandb_entity,
                mode=args.wandb_mode,
                name=args.wandb_name,
                dir=args.wandb_dir,
                alerts=args.wandb_alerts,
            )
        )
    return sinks


def cmd_watch(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from fleetscope.collector import Collector
    from fleetscope.health import HealthThresholds
    from fleetscope.signals import stop_on_signals

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    fixed = _endpoints_from_args(args)
    endpoints = list(fixed)
    initial_text = None
    if args.endpoints_file:
        try:
            initial_text = asyncio.run(read_stable_text(args.endpoints_file))
            endpoints += parse_endpoints_text(initial_text)
        except (OSError, ValueError) as e:
            from fleetscope._redact import redact

            raise SystemExit(
                f"fleetscope: endpoints file {args.endpoints_file}: {redact(str(e))}"
            ) from None
    if args.once:
        return asyncio.run(_watch_once(args, endpoints))
    terminal = not args.no_tui
    sinks = build_sinks(args, terminal=terminal)
    collector = Collector(
        endpoints,
        interval=args.interval,
        sinks=sinks,
        timeout=args.timeout,
        headers=_headers_from_args(args),
        verify=not args.insecure,
        schema=args.schema,
        health_thresholds=HealthThresholds(
            stall_seconds=args.stall_seconds, outlier_seconds=args.outlier_seconds
        ),
    )

    async def run() -> None:
        async with collector:
            follow = None
            if args.endpoints_file:
                follow = asyncio.create_task(
                    _follow_endpoints_file(
                        collector,
                        args.endpoints_file,
                        fixed,
                        args.interval,
                        applied=initial_text,
                    )
                )
            # SIGINT, SIGTERM and SIGHUP: last poll, run summary to every sink, sinks closed,
            # exit 0 (fleetscope.signals; a second signal during the stop is ignored)
            stopper = stop_on_signals(collector, chain=False)
            try:
                waits = [asyncio.ensure_future(stopper.wait())]
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


async def _watch_once(args: argparse.Namespace, endpoints) -> int:
    import asyncio

    from fleetscope.collector import Collector

    collector = Collector(
        endpoints,
        interval=args.interval,
        timeout=args.timeout,
        headers=_headers_from_args(args),
        verify=not args.insecure,
        schema=args.schema,
    )
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


def cmd_simulate(args: argparse.Namespace) -> int:
    from fleetscope.simulate.server import cli_main

    return cli_main(args.rest)


def cmd_demo(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    from pathlib import Path

    from fleetscope.demo import print_report, run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    result = asyncio.run(
        run_demo(
            duration=args.duration,
            interval=args.interval,
            out_dir=Path(args.out),
            use_wandb=not args.no_wandb,
            live=None if not args.no_tui else False,
        )
    )
    print_report(result)
    return 0


def cmd_dashboard_grafana(args: argparse.Namespace) -> int:
    from fleetscope.dashboards.grafana import dashboard_json

    text = dashboard_json(
        title=args.title,
        uid=args.uid,
        datasource=args.datasource,
        metric_prefix=args.metric_prefix,
        role_label=args.role_label,
    )
    if args.out in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


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


def _dashboard_kinds(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The ``dashboard KIND`` group, created by whichever dashboard kind is added first."""
    dash = sub.choices.get("dashboard")
    if dash is None:
        dash = sub.add_parser("dashboard", help="generate dashboards from code")
        dash.set_defaults(func=lambda a: dash.print_help() or 2)
    kinds = getattr(dash, "fleetscope_kinds", None)
    if kinds is None:
        kinds = dash.add_subparsers(dest="dashboard_kind", metavar="KIND")
        dash.fleetscope_kinds = kinds
    return kinds


def _add_grafana_parsers(sub: argparse._SubParsersAction) -> None:
    """``dashboard grafana`` and ``annotate`` (the ``dashboard`` group is shared with other
    dashboard kinds: it is created here only if nobody created it before)."""
    kinds = _dashboard_kinds(sub)
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

    if args.dry_run:  # the panels only, no W&B call
        disagg = args.mode == "role-aware"
        panels = ww.inference_panels(disagg, args.prefix)
        out = {
            "name": args.name or ww.default_view_name(disagg),
            "section": ww.SECTION_NAME,
            "disaggregated": disagg,
            "panels": [{"title": p.title, "keys": list(p.keys)} for p in panels],
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
        )
    except Exception as e:
        print(f"fleetscope dashboard wandb: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    kind = "role-aware (prefill/decode)" if disagg else "colocated"
    print(f"{result.action}: {kind} view {result.workspace.name!r} {result.url or ''}".rstrip())
    return 0


def _add_wandb_dashboard_parser(sub: argparse._SubParsersAction) -> None:
    """``dashboard wandb`` (the ``dashboard`` group is shared: created here if missing)."""
    kinds = _dashboard_kinds(sub)
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
        "--dry-run",
        action="store_true",
        help="print the panels as JSON, contact nothing (--auto counts as --plain)",
    )
    w.set_defaults(func=cmd_dashboard_wandb)


def _add_sink_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jsonl", default=None, help="append every poll to this JSONL file")
    p.add_argument("--wandb-project", default=None, help="log to this W&B project")
    p.add_argument("--wandb-entity", default=None)
    p.add_argument("--wandb-name", default=None, help="W&B run name")
    p.add_argument("--wandb-dir", default=None, help="where W&B writes its run files")
    p.add_argument("--wandb-alerts", action="store_true", help="send health events as W&B alerts")
    p.add_argument(
        "--wandb-mode",
        choices=["online", "offline", "disabled"],
        default=None,
        help="default: online when an API key is configured, else offline",
    )


def _print_table(keys: dict[str, float], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        title=f"fleetscope inspect — {len(keys)} keys over {args.interval:g} s",
        show_lines=False,
        header_style="bold",
    )
    table.add_column("key", overflow="fold")
    table.add_column("value", justify="right")
    pattern = args.filter
    for k, v in keys.items():
        if pattern and pattern not in k:
            continue
        table.add_row(k, f"{v:.6g}")
    console.print(table)


def build_parser() -> argparse.ArgumentParser:
    from fleetscope.health import HealthThresholds

    health_defaults = HealthThresholds()
    p = argparse.ArgumentParser(
        prog="fleetscope",
        description="Correct fleet statistics for vLLM inference engines from their /metrics.",
    )
    p.add_argument("--version", action="version", version=f"fleetscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    ins = sub.add_parser(
        "inspect",
        help="keys and values the collector would log between two expositions",
        description=(
            "Compute, from two saved expositions (files) or two scrapes of one URL, exactly the "
            "keys and values the collector would log for that interval."
        ),
    )
    ins.add_argument("prev", help="earlier exposition: a file, or a URL (scraped twice)")
    ins.add_argument("cur", help="later exposition: a file, or the same URL")
    ins.add_argument("--interval", type=float, default=5.0, help="seconds between them (5)")
    ins.add_argument("--json", action="store_true", help="one flat JSON object {key: value}")
    ins.add_argument("--compact", action="store_true", help="with --json: on one line")
    ins.add_argument("--schema", choices=["prime-rl", "skyrl"], default="prime-rl")
    ins.add_argument("--role", choices=["prefill", "decode"], default=None)
    ins.add_argument("--name", default=None, help="endpoint name (server0)")
    ins.add_argument("--filter", default=None, help="only keys containing this text")
    ins.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="for URLs: seconds for each whole download (5); bodies are capped like scrapes",
    )
    ins.set_defaults(func=cmd_inspect)

    w = sub.add_parser(
        "watch",
        help="watch a fleet: live view, W&B, JSONL",
        description="Poll every endpoint's /metrics and log correct fleet statistics.",
    )
    w.add_argument("urls", nargs="*", help="base URLs of vLLM servers (role: none)")
    w.add_argument(
        "--role", action="append", metavar="ROLE=URL", help="prefill=URL or decode=URL (repeat)"
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
    w.add_argument("--interval", type=float, default=5.0, help="seconds between polls (5)")
    w.add_argument("--timeout", type=float, default=5.0, help="per-scrape timeout (5)")
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
    w.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    w.add_argument("--once", action="store_true", help="two polls one interval apart, print")
    w.add_argument("--json", action="store_true", help="with --once: keys as one JSON object")
    w.add_argument("--no-tui", action="store_true", help="no live terminal view")
    w.add_argument("--schema", choices=["prime-rl", "skyrl"], default="prime-rl")
    w.add_argument("--bearer-token", default=None, help="Authorization: Bearer token")
    w.add_argument("--bearer-env", default=None, help="read the bearer token from this env var")
    w.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    _add_sink_args(w)
    w.set_defaults(func=cmd_watch)

    sim = sub.add_parser(
        "simulate",
        help="serve a simulated vLLM fleet on loopback",
        add_help=False,
        description="Serve a simulated vLLM 0.32 fleet (see `fleetscope simulate --help`).",
    )
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    sim.set_defaults(func=cmd_simulate)

    d = sub.add_parser(
        "demo",
        help="watch a simulated fleet for ~30 s: live view, W&B offline, JSONL, one fault",
    )
    d.add_argument("--duration", type=float, default=30.0, help="seconds (30)")
    d.add_argument("--interval", type=float, default=2.0, help="seconds between polls (2)")
    d.add_argument("--out", default="fleetscope-demo", help="output folder")
    d.add_argument("--no-wandb", action="store_true", help="skip the W&B sink")
    d.add_argument("--no-tui", action="store_true", help="print tables instead of a live view")
    d.set_defaults(func=cmd_demo)
    _add_grafana_parsers(sub)
    _add_wandb_dashboard_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:
        # argparse.REMAINDER does not take options that come first (`simulate --endpoints 4`
        # was "unrecognized arguments"): the simulator parses its own command line
        from fleetscope.simulate.server import cli_main

        return int(cli_main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
